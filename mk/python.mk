# Python binding (python/te, python/mooncake) tests against build/libte.so.
# They use unittest only; numpy cases run when $(PYTHON) has numpy (CI installs
# python3-numpy from Debian; elsewhere e.g. `make test-python PYTHON=/usr/bin/python3`).
.PHONY: test-python

PYTHON ?= python3
LIBTE ?= $(BUILD)/libte.so
TEST_TARGETS += test-python

test-python: $(LIBTE)
	TE_LIBRARY=$(abspath $(LIBTE)) PYTHONPATH=$(abspath python) \
		$(PYTHON) -m unittest discover -s python/tests -v
