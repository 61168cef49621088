# The C and Python handoff tests (tests/c/handoff.c through ctest,
# python/tests/test_handoff.py) run a real te-sidecar: build it first and
# tell the Python tests where it is.
test-python: $(BUILD)/te-sidecar
test-python: export TE_SIDECAR = $(abspath $(BUILD)/te-sidecar)
