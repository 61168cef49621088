# arm64 (aarch64: the NVIDIA Grace hosts of GH200 and GB200/GB300 systems),
# cross-built on x86-64 with Debian's cross toolchain and tested under
# qemu-user (.ci/deps.d/arm64.pkgs installs both).
#
#   make ARCH=arm64            build/arm64/libte.so, te-sidecar, te-bench for
#                              arm64 (CC=aarch64-linux-gnu-gcc GOARCH=arm64),
#                              with the version and te.h ABI of the x86-64 build
#   make ARCH=arm64 wheel      build/arm64/wheel/te-<version>-py3-none-linux_aarch64.whl
#   make ARCH=arm64 install PREFIX=...   installs that tree (as make install)
#   make ARCH=arm64 fakes      the fake libibverbs/libcuda built for arm64
#   make arm64                 the same as make ARCH=arm64 all wheel
#   make test-arm64            (part of make test) the cross-built Go tests, the
#                              layout checks and the C two-engine tests under
#                              qemu-aarch64-static: mk/arm64-test.sh says what
#                              runs and what is skipped and why
#
# ARCH=arm64 is read here, before mk/capi.mk and the others: it moves BUILD
# to build/arm64 (unless BUILD is given) and exports GOARCH, CC and
# CGO_ENABLED, so every rule of the other files builds for arm64 unchanged.
.PHONY: arm64 test-arm64

ARM64_CC ?= aarch64-linux-gnu-gcc
ARM64_SYSROOT ?= /usr/aarch64-linux-gnu
QEMU_AARCH64 ?= qemu-aarch64-static

ifeq ($(ARCH),arm64)
ifneq ($(origin BUILD),command line)
BUILD := $(BUILD)/arm64
endif
export GOARCH := arm64
export CC := $(ARM64_CC)
export CGO_ENABLED := 1
ARM64_BUILD := $(BUILD)
else ifneq ($(ARCH),)
$(error ARCH=$(ARCH): only ARCH=arm64 (a cross build) is known; without ARCH make builds for this machine)
else
ARM64_BUILD := $(BUILD)/arm64
endif

# The sub-makes name BUILD themselves so that a BUILD given to this make
# (which they inherit) cannot put arm64 files over the native ones.
ARM64_MAKE = $(MAKE) --no-print-directory ARCH=arm64 BUILD=$(ARM64_BUILD)

arm64:
	$(ARM64_MAKE) all wheel

TEST_TARGETS += test-arm64
ARM64_TEST_FLAGS ?=
test-arm64:
	@if ! command -v $(ARM64_CC) >/dev/null || ! command -v $(QEMU_AARCH64) >/dev/null || [ ! -d $(ARM64_SYSROOT)/lib ]; then \
		echo "test-arm64: SKIPPED: needs $(ARM64_CC), $(QEMU_AARCH64) and $(ARM64_SYSROOT) (make deps installs them: .ci/deps.d/arm64.pkgs)"; \
		exit 0; \
	fi; \
	set -e; $(ARM64_MAKE) all wheel; \
	GO=$(GO) BUILD_ARM64=$(ARM64_BUILD) ARM64_CC=$(ARM64_CC) ARM64_SYSROOT=$(ARM64_SYSROOT) QEMU_AARCH64=$(QEMU_AARCH64) \
		TE_VERSION=$(TE_VERSION) PYTHON=$(PYTHON) mk/arm64-test.sh $(ARM64_TEST_FLAGS)
