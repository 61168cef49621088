// Package schema validates deploy/kubernetes against the Kubernetes API
// without a cluster or the network: it builds the base kustomization and
// the with-monitoring overlay with kustomize's own Go API (krusty, what
// kubectl apply -k runs), then decodes every object it emits strictly
// (an unknown or misspelt field, or a value of the wrong type, is an
// error) into the Go types of k8s.io/api and of the Prometheus Operator,
// the types the API server's schemas are generated from, and checks the
// fields the API server requires.
//
// It is a module of its own so that k8s.io/api, kustomize and the
// operator's types stay out of te's go.mod; make test-deploy-schema
// (mk/deploy.mk) runs it as part of make test.
package schema
