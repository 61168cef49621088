# examples/: runnable programs (Python, the Mooncake drop-in, C and C++ with
# CMake, Go, curl against te-sidecar), each built and run by
# make test-examples (examples/run.sh) against what `make` built.
.PHONY: test-examples
TEST_TARGETS += test-examples

# The wheel's stamp is named literally: mk/python.mk, which names it
# WHEEL_STAMP, is read after this file.
test-examples: $(BUILD)/wheel/.built $(LIBTE) $(BUILD)/te-sidecar
	BUILD=$(BUILD) PYTHON=$(PYTHON) GO=$(GO) TE_LIBTE=$(LIBTE) TE_SIDECAR=$(BUILD)/te-sidecar examples/run.sh
