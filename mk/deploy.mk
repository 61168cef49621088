# tests/deploy/schema: deploy/kubernetes built with kustomize's Go API and
# decoded strictly into the Kubernetes API's Go types (and the Prometheus
# Operator's), offline. A module of its own (k8s.io/api and kustomize stay
# out of te's go.mod), so go test ./... does not reach it: this suite does.
.PHONY: test-deploy-schema
TEST_TARGETS += test-deploy-schema

test-deploy-schema:
	@echo "test-deploy-schema: kustomize build + strict decoding of deploy/kubernetes (tests/deploy/schema)"
	cd tests/deploy/schema && $(GO) test -count=1 ./...
