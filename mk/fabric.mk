# fabric (issue 29): the transport over libfabric. Its suites are Go tests,
# so test-go (make test) runs them on every provider present (tcp, shm,
# sockets; each skips with one line where libfabric or the provider is
# absent). These targets run them alone, and the bench against te's tcp.
.PHONY: test-fabric bench-fabric

test-fabric:
	$(GO) test -tags '$(TAGS)' -race -count=1 -timeout 15m ./internal/sys/fabric/ ./engine/transport/fabric/

# fabric over libfabric's tcp provider against te's tcp transport, same
# run, then fi_pingpong -p tcp (bench/README.md, "fabric").
FABRIC_ROUNDS ?= 3
FABRIC_PROVIDER ?= tcp
bench-fabric: $(BUILD)/te-bench
	bench/fabric-compare.sh $(BUILD)/te-bench $(FABRIC_ROUNDS) $(FABRIC_PROVIDER)
