# libte.so (the C ABI, include/te.h), its CMake package and the C tests.
#   make                      builds $(BUILD)/libte.so
#   make test-c               builds with CMake and runs ctest (tests/c)
#   make install PREFIX=/opt  installs lib, te.h, te-config.cmake and te.pc
#   make bench-capi           C ABI vs Go API cost per request
.PHONY: libte test-c install-capi bench-capi

CMAKE ?= cmake
CTEST ?= ctest
LIBTE := $(BUILD)/libte.so
TE_SONAME := libte.so.1
CMAKE_BUILD := $(BUILD)/cmake

ALL_TARGETS += $(LIBTE)
TEST_TARGETS += test-c

$(LIBTE): $(shell find capi engine internal -name '*.go' -not -name '*_test.go') include/te.h go.mod go.sum
	@mkdir -p $(BUILD)
	$(GO) build -buildmode=c-shared -trimpath -ldflags=-extldflags=-Wl,-soname,$(TE_SONAME) -o $@ ./capi
	@rm -f $(BUILD)/libte.h   # cgo's header; include/te.h is the public one
	ln -sf libte.so $(BUILD)/$(TE_SONAME)

libte: $(LIBTE)

test-c:
	$(CMAKE) -S . -B $(CMAKE_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	$(CMAKE) --build $(CMAKE_BUILD) -j2
	cd $(CMAKE_BUILD) && $(CTEST) --output-on-failure

install-capi:
	$(CMAKE) -S . -B $(BUILD)/cmake-install -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
		-DCMAKE_INSTALL_PREFIX=$(PREFIX)
	$(CMAKE) --build $(BUILD)/cmake-install -j2
	$(CMAKE) --install $(BUILD)/cmake-install

install: install-capi

bench-capi:
	$(GO) test -run '^$$' -bench SubmitWait128 -benchtime 3000x -count 5 ./capi
