# libte.so (the C ABI, include/te.h), its CMake package and the C tests.
#   make                      builds $(BUILD)/libte.so (stripped unless STRIP=0)
#   make test-c               runs ctest (tests/c) against that library
#   make install PREFIX=/opt  installs it with te.h, te-config.cmake and te.pc
#                             (through CMake, without building anything again)
#   make bench-capi           C ABI vs Go API cost per request
.PHONY: libte test-c install-capi bench-capi

CMAKE ?= cmake
CTEST ?= ctest
LIBTE := $(BUILD)/libte.so
TE_SONAME := libte.so.1
CMAKE_BUILD := $(BUILD)/cmake

ALL_TARGETS += $(LIBTE)
TEST_TARGETS += test-c

# The same flags as CMakeLists.txt and python/pep517/te_build.py: the soname,
# and capi/libte.map, which leaves te.h's functions the only exported symbols.
LIBTE_LDFLAGS := $(if $(filter 1,$(STRIP)),-s -w )$(GO_VERSION_LDFLAGS) -extldflags '-Wl,-soname,$(TE_SONAME) -Wl,--version-script=$(CURDIR)/capi/libte.map'

$(BUILD)/.libte.flags: FORCE
	$(call flags_stamp,tags=$(TAGS) strip=$(STRIP) version=$(TE_VERSION))

# The Go sources come from $(LIBTE).d, written by mk/godeps.sh.
$(LIBTE): include/te.h capi/libte.map go.mod go.sum $(BUILD)/.libte.flags
	@mkdir -p $(BUILD)
	@echo "building $@ $(TE_VERSION) (go build -v: a line per package compiled; minutes on a fresh machine)"
	$(GO) build -v -buildmode=c-shared -trimpath -tags '$(TAGS)' -ldflags="$(LIBTE_LDFLAGS)" -o $@ ./capi
	@rm -f $(BUILD)/libte.h   # cgo's header; include/te.h is the public one
	@ln -sf libte.so $(BUILD)/$(TE_SONAME)
	@mk/godeps.sh $@ ./capi
	@echo "$@: $$(du -h $@ | cut -f1)"
-include $(LIBTE).d

libte: $(LIBTE)

# ctest builds the C tests against the library `make` built (and the
# handoff test against its te-sidecar).
test-c: $(LIBTE) $(BUILD)/te-sidecar
	$(CMAKE) -S . -B $(CMAKE_BUILD) -DCMAKE_BUILD_TYPE=Release -DTE_PREBUILT_LIBRARY=$(abspath $(LIBTE)) \
		-DTE_PREBUILT_SIDECAR=$(abspath $(BUILD)/te-sidecar) -DTE_GO_TAGS='$(TAGS)' -DTE_VERSION_STRING='$(TE_VERSION)'
	$(CMAKE) --build $(CMAKE_BUILD) -j2
	cd $(CMAKE_BUILD) && $(CTEST) --output-on-failure

install-capi: $(LIBTE)
	@command -v $(CMAKE) >/dev/null || { echo "make install needs cmake: run make deps (or apt-get install cmake)"; exit 1; }
	$(CMAKE) -S . -B $(BUILD)/cmake-install -DBUILD_TESTING=OFF -DCMAKE_INSTALL_PREFIX=$(PREFIX) \
		-DTE_PREBUILT_LIBRARY=$(abspath $(LIBTE))
	$(CMAKE) --install $(BUILD)/cmake-install

install: install-capi

bench-capi:
	$(GO) test -run '^$$' -bench SubmitWait128 -benchtime 3000x -count 5 ./capi
