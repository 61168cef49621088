# `make demo`: the prefill-to-decode handoff on loopback. It builds te-sidecar
# and te-demo, then te-demo starts the sidecar and a prefill and a decode
# process (Llama-3-8B-shaped cache, 4096-token prompt) and checks every byte.
# It runs with a random cluster secret (or the one in TE_AUTH_SECRET_FILE or
# TE_AUTH_SECRET). DEMO_ARGS passes flags, e.g. DEMO_ARGS="-transport tcp
# -modes push", or DEMO_ARGS=-secret=false to run without a secret.
DEMO_TARGET := 1
DEMO_ARGS ?=

.PHONY: demo
# The binaries go to $(BUILD)/demo so that they never stand in for the
# release builds of other rules. te-sidecar carries the version of
# mk/meta.mk (git describe), as the release build does.
demo: deps
	@mkdir -p $(BUILD)/demo
	@echo "demo: building te-sidecar and te-demo $(TE_VERSION) (go build -v: a line per package compiled; minutes on a fresh machine)"
	$(GO) build -v -ldflags "$(SIDECAR_LDFLAGS)" -o $(BUILD)/demo/te-sidecar ./cmd/te-sidecar
	$(GO) build -v -ldflags "$(GO_VERSION_LDFLAGS)" -o $(BUILD)/demo/te-demo ./cmd/te-demo
	@echo "demo: running (a few seconds)"
	$(BUILD)/demo/te-demo -sidecar-bin $(BUILD)/demo/te-sidecar $(DEMO_ARGS)
