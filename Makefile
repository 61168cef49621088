# te: build, test and lint. `make test` runs every test (Go, C, Python);
# `make demo` runs the prefill-to-decode handoff demo.
#
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
PYTHON ?= python3
TAGS ?=
STRIP ?= 1
export CGO_ENABLED ?= 1
export GO TAGS

# Extra test steps (C, Python, ...) add themselves to TEST_TARGETS from mk/*.mk;
# ALL_TARGETS likewise for what `make` builds.
TEST_TARGETS :=
ALL_TARGETS :=

.PHONY: all deps test test-go torture lint demo clean fmt install FORCE

all: build-all

# flags_stamp keeps $@ holding $(1), touching it only when $(1) changed, so
# that outputs built with other flags (TAGS, STRIP) are rebuilt.
define flags_stamp
@mkdir -p $(dir $@); f="$(1)"; [ "$$(cat $@ 2>/dev/null)" = "$$f" ] || echo "$$f" >$@
endef

-include mk/*.mk

build-all: $(ALL_TARGETS)

# Installs what a fresh machine lacks (Debian packages, Go modules); a no-op
# when everything is there.
deps:
	@bash .ci/deps.sh

test: deps
	$(MAKE) test-go $(TEST_TARGETS)

ifeq ($(DEMO_TARGET),)
demo:
	@echo "make demo arrives with the kvcache/handoff work (issue: kvcache layouts, handoff, demo)"
endif

# -race for everything: the engine and every transport are concurrent.
test-go:
	$(GO) vet -tags '$(TAGS)' ./...
	$(GO) test -tags '$(TAGS)' -race -count=1 -timeout 15m ./...

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
