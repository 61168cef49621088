# te-sidecar: the per-pod daemon (HTTP metadata, /healthz, /metrics). Its Go
# tests and the metadata-store tests (real etcd and redis on loopback) run in
# `make test-go`; .ci/deps.d/meta.pkgs installs the servers.
.PHONY: te-sidecar
SIDECAR_VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

$(BUILD)/te-sidecar: $(shell find cmd/te-sidecar internal engine kvcache -name '*.go' -not -name '*_test.go') go.mod go.sum
	@mkdir -p $(BUILD)
	$(GO) build -ldflags "-X github.com/tecache/te/internal/sidecar.Version=$(SIDECAR_VERSION)" -o $@ ./cmd/te-sidecar

te-sidecar: $(BUILD)/te-sidecar
ALL_TARGETS += te-sidecar
