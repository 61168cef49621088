# te-sidecar: the per-pod daemon (HTTP metadata, /healthz, /metrics). Its Go
# tests and the metadata-store tests (real etcd and redis on loopback) run in
# `make test-go`; .ci/deps.d/meta.pkgs installs the servers.
.PHONY: te-sidecar
# te-sidecar -version prints the same string as te_version() and te-bench.
SIDECAR_LDFLAGS = $(GO_VERSION_LDFLAGS) -X github.com/tecache/te/cmd/te-sidecar/sidecar.Version=$(TE_VERSION)

$(BUILD)/.te-sidecar.flags: FORCE
	$(call flags_stamp,tags=$(TAGS) version=$(TE_VERSION))

# The Go sources come from $(BUILD)/te-sidecar.d, written by mk/godeps.sh.
$(BUILD)/te-sidecar: go.mod go.sum $(BUILD)/.te-sidecar.flags
	@mkdir -p $(BUILD)
	@echo "building $@ $(TE_VERSION) (go build -v: a line per package compiled)"
	$(GO) build -v -trimpath -tags '$(TAGS)' -ldflags "$(SIDECAR_LDFLAGS)" -o $@ ./cmd/te-sidecar
	@mk/godeps.sh $@ ./cmd/te-sidecar
-include $(BUILD)/te-sidecar.d

te-sidecar: $(BUILD)/te-sidecar
ALL_TARGETS += $(BUILD)/te-sidecar
