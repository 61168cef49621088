# te-bench: target / initiator / loopback benchmark (see bench/README.md).
.PHONY: te-bench bench-table bench-mooncake

ALL_TARGETS += $(BUILD)/te-bench

$(BUILD)/.te-bench.flags: FORCE
	$(call flags_stamp,tags=$(TAGS) version=$(TE_VERSION))

# The Go sources come from $(BUILD)/te-bench.d, written by mk/godeps.sh.
$(BUILD)/te-bench: go.mod go.sum $(BUILD)/.te-bench.flags
	@mkdir -p $(BUILD)
	@echo "building $@ $(TE_VERSION) (go build -v: a line per package compiled)"
	$(GO) build -v -trimpath -tags '$(TAGS)' -ldflags "$(GO_VERSION_LDFLAGS)" -o $@ ./bench/te-bench
	@mk/godeps.sh $@ ./bench/te-bench
-include $(BUILD)/te-bench.d

te-bench: $(BUILD)/te-bench

# The table in bench/README.md: every block size, read and write, 1 and 2
# initiator threads, batch 128, over tcp between two processes.
BENCH_DURATION ?= 2s
BENCH_FLAGS ?=
bench-table: $(BUILD)/te-bench
	$(BUILD)/te-bench loopback --transport tcp --op read,write --block 4KiB,64KiB,1MiB,4MiB \
		--batch 128 --threads 1,2 --duration $(BENCH_DURATION) $(BENCH_FLAGS)

# te against Mooncake Transfer Engine (bench/README.md, "Mooncake"): needs
# Mooncake's binaries in ../shared/interop/mooncake or TE_MOONCAKE_INTEROP_DIR.
BENCH_MC_FLAGS ?= --duration 2 --rounds 5
bench-mooncake: $(BUILD)/te-bench
	TE_BENCH=$(BUILD)/te-bench bench/mooncake-compare.sh $(BENCH_MC_FLAGS)
