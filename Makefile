# te: build, test and lint. `make test` runs every test suite (Go, C,
# Python, pip, examples, deploy files), each whether or not the ones before
# it failed, and ends with a summary line per suite; `make demo` runs the
# prefill-to-decode handoff demo.
#
#   make test-go             one suite alone (make list-suites names them)
#   make test TEST_SUITES="test-c test-python"   a chosen set, with the summary
#   make                     build/libte.so, build/te-sidecar, build/te-bench
#   make install PREFIX=...  installs what `make` built (C library, te.h,
#                            CMake package, pkg-config file); needs cmake
#   make wheel               the Python wheel in build/wheel (pip install . builds one too)
#   TAGS="te_noetcd te_noredis" make   leave metadata stores out of every binary
#   STRIP=0 make             keep symbol tables in libte.so (stripped by default)
#
# make knows the files each output is built from (mk/godeps.sh records them
# in build/*.d as it builds), so a `make` with nothing changed does nothing.
SHELL := /bin/bash
GO ?= go
BUILD ?= build
PREFIX ?= /usr/local
# Debian's python3 (/usr/bin) is the one with python3-numpy and python3-torch;
# another python3 may come first on PATH.
PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || echo python3)
TAGS ?=
STRIP ?= 1
export CGO_ENABLED ?= 1
# te's version (mk/version.sh: te.h's ABI version + the commit), stamped
# into every binary and the wheel; computed once per make.
TE_VERSION := $(shell mk/version.sh)
GO_VERSION_LDFLAGS := -X github.com/tecache/te/engine.Version=$(TE_VERSION)
export GO TAGS TE_VERSION

# Extra test steps (C, Python, ...) add themselves to TEST_TARGETS from mk/*.mk;
# ALL_TARGETS likewise for what `make` builds.
TEST_TARGETS :=
ALL_TARGETS :=

.PHONY: all deps test test-suites test-go torture lint demo clean fmt install list-suites version docs FORCE

all: build-all

# flags_stamp keeps $@ holding $(1), touching it only when $(1) changed, so
# that outputs built with other flags (TAGS, STRIP, TE_VERSION) are rebuilt
# (only relinked, when the version alone changed: Go caches the compile).
define flags_stamp
@mkdir -p $(dir $@); f="$(1)"; [ "$$(cat $@ 2>/dev/null)" = "$$f" ] || echo "$$f" >$@
endef

-include mk/*.mk

build-all: $(ALL_TARGETS)

# Installs what a fresh machine lacks (Debian packages, Go modules); a no-op
# when everything is there.
deps:
	@echo "deps: checking Debian packages and Go modules (.ci/deps.sh)"
	@bash .ci/deps.sh

# Each suite runs in a make of its own (mk/suites.sh), so a failing one
# stops none of the others; the summary says which failed and make test
# exits non-zero if any did.
TEST_SUITES ?= test-go $(TEST_TARGETS)
SUITE_MAKE = $(MAKE) --no-print-directory -f $(firstword $(MAKEFILE_LIST))

test: deps
	@SUITE_MAKE="$(SUITE_MAKE)" mk/suites.sh $(TEST_SUITES)

# test-suites: the same without `make deps` first.
test-suites:
	@SUITE_MAKE="$(SUITE_MAKE)" mk/suites.sh $(TEST_SUITES)

ifeq ($(DEMO_TARGET),)
demo:
	@echo "make demo arrives with the kvcache/handoff work (issue: kvcache layouts, handoff, demo)"
endif

# -race for everything: the engine and every transport are concurrent.
# go test prints a line per package as it finishes; mk/heartbeat.sh says
# "still running" every 30 s while it compiles.
test-go:
	@echo "test-go: go vet ./... (compiles every package: minutes on a fresh machine)"
	@mk/heartbeat.sh "test-go: go vet" $(GO) vet -tags '$(TAGS)' ./...
	@echo "test-go: go test -race ./... ($$($(GO) list -tags '$(TAGS)' ./... | wc -l) packages, a line as each finishes)"
	@mk/heartbeat.sh "test-go: go test" $(GO) test -tags '$(TAGS)' -race -count=1 -timeout 15m ./...

# The fence torture of every transport's conformance suite, longer than the
# 2 s make test gives it: make torture TORTURE_TIME=10m [TORTURE_SEED=n]
TORTURE_TIME ?= 1m
TORTURE_SEED ?=
torture:
	set -o pipefail; TE_TORTURE_TIME=$(TORTURE_TIME) TE_TORTURE_SEED=$(TORTURE_SEED) $(GO) test -tags '$(TAGS)' -race -count=1 -p 1 \
		-timeout 0 -v -run 'Conformance/Torture|suite/Torture' ./engine/transport/... 2>&1 | grep -E '^(=== RUN|---|\s+torture|ok|FAIL|PASS)'

lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt: $$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BUILD)

# The suites make test runs, one per line.
list-suites:
	@printf '%s\n' $(TEST_SUITES)

version:
	@echo $(TE_VERSION)

# docs/c-api.md and docs/python-api.md from te.h and the docstrings
# (tests/docs checks they are current).
docs:
	$(PYTHON) docs/gen.py
