# te-sidecar: the per-pod daemon (HTTP metadata, /healthz, /metrics). Its Go
# tests and the metadata-store tests (real etcd and redis on loopback) run in
# `make test-go`; .ci/deps.d/meta.pkgs installs the servers.
.PHONY: te-sidecar
SIDECAR_VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)

$(BUILD)/.te-sidecar.flags: FORCE
	$(call flags_stamp,tags=$(TAGS))

# The Go sources come from $(BUILD)/te-sidecar.d, written by mk/godeps.sh.
$(BUILD)/te-sidecar: go.mod go.sum $(BUILD)/.te-sidecar.flags
	@mkdir -p $(BUILD)
	$(GO) build -trimpath -tags '$(TAGS)' -ldflags "-X github.com/tecache/te/cmd/te-sidecar/sidecar.Version=$(SIDECAR_VERSION)" -o $@ ./cmd/te-sidecar
	@mk/godeps.sh $@ ./cmd/te-sidecar
-include $(BUILD)/te-sidecar.d

te-sidecar: $(BUILD)/te-sidecar
ALL_TARGETS += $(BUILD)/te-sidecar
