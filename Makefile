# te: build, test and lint. `make test` runs every test (Go, C, Python);
# `make demo` runs the prefill-to-decode handoff demo.
SHELL := /bin/bash
GO ?= go
BUILD ?= build
PREFIX ?= /usr/local
export CGO_ENABLED ?= 1

# Extra test steps (C, Python, ...) add themselves to TEST_TARGETS from mk/*.mk;
# ALL_TARGETS likewise for what `make` builds.
TEST_TARGETS :=
ALL_TARGETS :=

.PHONY: all deps test test-go lint demo clean fmt install

all: build-all

-include mk/*.mk

build-all: $(ALL_TARGETS)
	$(GO) build ./...

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
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 15m ./...

lint:
	@bad=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$bad" ]; then echo "gofmt: $$bad"; exit 1; fi
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf $(BUILD)
