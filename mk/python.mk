# The Python package (python/te with libte.so inside, python/mooncake) as a
# platform wheel, and its tests against the installed wheel.
#   make wheel            $(BUILD)/wheel/te-<version>-py3-none-<platform>.whl
#   make test-python      installs the wheel into a fresh venv and runs
#                         python/tests there: no TE_LIBRARY, no PYTHONPATH
#   make test-pip-install `pip install .` from this tree into another fresh
#                         venv (building libte.so with Go through the
#                         in-tree backend), then `import te, mooncake.engine`
# numpy cases run when $(PYTHON) has numpy: the test venv sees the system's
# site-packages (CI installs python3-numpy from Debian).
.PHONY: wheel test-python test-pip-install

WHEEL_DIR := $(BUILD)/wheel
WHEEL_STAMP := $(WHEEL_DIR)/.built
VENV := $(BUILD)/venv
PIP_VENV := $(BUILD)/venv-pip
PY_PACKAGE := $(wildcard python/te/*.py python/mooncake/*.py python/pep517/*.py) pyproject.toml README.md
TEST_TARGETS += test-python test-pip-install

# The wheel bundles the libte.so `make` built (TE_WHEEL_LIBTE) rather than
# linking another one.
$(WHEEL_STAMP): $(LIBTE) $(PY_PACKAGE) include/te.h
	@echo "wheel: packaging $(LIBTE) with python/te and python/mooncake, version $(TE_VERSION)"
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	TE_WHEEL_LIBTE=$(abspath $(LIBTE)) $(PYTHON) -m pip wheel -q --no-index --no-deps --no-build-isolation \
		--no-cache-dir -w $(WHEEL_DIR) .
	@touch $@

wheel: $(WHEEL_STAMP)

# te-bench of the same build: test_ops checks that its -version agrees
# with te.__version__ and te_version().
test-python: $(WHEEL_STAMP) $(BUILD)/te-bench
test-python: export TE_BENCH = $(abspath $(BUILD)/te-bench)
test-python:
	rm -rf $(VENV)
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python -m pip install -q --no-index --no-deps $(WHEEL_DIR)/te-*.whl
	cd python/tests && env -u TE_LIBRARY -u PYTHONPATH TE_TEST_INSTALLED=1 \
		$(abspath $(VENV))/bin/python -m unittest discover -s . -v

test-pip-install: export TE_GO_TAGS = $(TAGS)
# pip -v shows the backend's progress (a line per Go package compiled and
# one every 15 s); without it pip shows its spinner only.
test-pip-install:
	rm -rf $(PIP_VENV)
	$(PYTHON) -m venv $(PIP_VENV)
	@echo "test-pip-install: pip install -v . (builds libte.so with Go: minutes on a fresh machine)"
	$(PIP_VENV)/bin/python -m pip install -v --no-index --no-cache-dir . 2>&1 | grep -E '^ *te_build:|error|Error|Successfully'; exit $${PIPESTATUS[0]}
	cd / && env -u TE_LIBRARY -u PYTHONPATH $(abspath $(PIP_VENV))/bin/python -c \
		'import te, mooncake.engine; te.load(); print("pip install . ->", te.library_path(), "ABI", te.abi_version())'
