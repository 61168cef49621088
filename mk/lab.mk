# lab (issue 33): te peers in hosts made of network namespaces, joined by a
# bridge per rail, with link faults, partitions, frozen processes and rate
# limits (tests/lab). Its tests are a Go package, so test-go (make test)
# runs them under -race; as non-root they skip with one line. This target
# runs them alone, verbosely.
.PHONY: lab-test

lab-test:
	$(GO) test -tags '$(TAGS)' -count=1 -v -timeout 5m ./tests/lab/
