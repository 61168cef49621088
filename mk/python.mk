# The Python package (python/te with libte.so inside, python/mooncake,
# python/nixl) as a platform wheel, and its tests against the installed wheel.
#   make wheel            $(BUILD)/wheel/te-<version>-py3-none-<platform>.whl
#   make test-python      installs the wheel into a fresh venv and runs
#                         python/tests there: no TE_LIBRARY, no PYTHONPATH
#   make test-pip-install `pip install .` from this tree into another fresh
#                         venv (building libte.so with Go through the
#                         in-tree backend), then `import te, mooncake.engine`
#   make test-nixl        NVIDIA NIXL's own pytest suite and its two-peer
#                         example (../shared/interop/nixl) against the nixl
#                         package of the installed wheel, with $(NIXL_PYTHON)
#                         (Debian's python3: torch, numpy, pytest); skipped
#                         when that folder is absent
# numpy cases run when $(PYTHON) has numpy: the test venv sees the system's
# site-packages (CI installs python3-numpy from Debian).
.PHONY: wheel test-python test-pip-install test-nixl

WHEEL_DIR := $(BUILD)/wheel
WHEEL_STAMP := $(WHEEL_DIR)/.built
VENV := $(BUILD)/venv
PIP_VENV := $(BUILD)/venv-pip
PY_PACKAGE := $(wildcard python/te/*.py python/mooncake/*.py python/nixl/*.py python/pep517/*.py) pyproject.toml \
	README.md
TEST_TARGETS += test-python test-pip-install test-nixl
NIXL_SUITE ?= ../shared/interop/nixl
NIXL_PYTHON ?= /usr/bin/python3
NIXL_VENV := $(BUILD)/venv-nixl

# The wheel bundles the libte.so `make` built (TE_WHEEL_LIBTE) rather than
# linking another one.
$(WHEEL_STAMP): $(LIBTE) $(PY_PACKAGE) include/te.h
	@echo "wheel: packaging $(LIBTE) with python/te, python/mooncake and python/nixl, version $(TE_VERSION)"
	rm -rf $(WHEEL_DIR) && mkdir -p $(WHEEL_DIR)
	TE_WHEEL_LIBTE=$(abspath $(LIBTE)) $(PYTHON) -m pip wheel -q --no-index --no-deps --no-build-isolation \
		--no-cache-dir -w $(WHEEL_DIR) .
	@touch $@

wheel: $(WHEEL_STAMP)

# te-bench of the same build: test_ops checks that its -version agrees
# with te.__version__ and te_version(). fakes: test_rdma_fabric.py runs two
# processes on the fake fabric (mk/fakes.mk).
test-python: $(WHEEL_STAMP) $(BUILD)/te-bench fakes
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

# NIXL's suite runs from an empty temporary folder (its query test writes
# files into the current one), once without and once with a cluster secret
# (every agent then authenticates). te_nixl_harness fails the run if a test skips
# for anything but a missing GPU; two_peers.py runs the example's target and
# initiator as two processes and checks the initiator verified the bytes.
test-nixl: $(WHEEL_STAMP)
	@if [ ! -d $(NIXL_SUITE)/test ]; then mk/skip.sh "test-nixl: $(NIXL_SUITE) is absent"; exit 0; fi; \
	set -e; rm -rf $(NIXL_VENV); \
	$(NIXL_PYTHON) -m venv --system-site-packages $(NIXL_VENV); \
	$(NIXL_VENV)/bin/python -m pip install -q --no-index --no-deps $(WHEEL_DIR)/te-*.whl; \
	suite=$$(cd $(NIXL_SUITE) && pwd); harness=$(abspath python/tests/nixl_suite); \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; cd "$$tmp"; \
	for secret in "" "$$(head -c 24 /dev/urandom | base64)"; do \
		if [ -n "$$secret" ]; then echo "test-nixl: with a cluster secret"; else echo "test-nixl: without one"; fi; \
		env -u TE_LIBRARY -u TE_AUTH_SECRET_FILE PYTHONPATH=$$harness TE_NIXL_HOST=127.0.0.1 TE_AUTH_SECRET="$$secret" \
			$(abspath $(NIXL_VENV))/bin/python -m pytest -p no:cacheprovider -p te_nixl_harness -rs -q \
			--timeout 300 $$suite/test --backend UCX; \
	done; \
	env -u TE_LIBRARY -u PYTHONPATH $(abspath $(NIXL_VENV))/bin/python $$harness/two_peers.py $$suite
