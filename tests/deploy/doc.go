// Package deploy checks the Dockerfile and the Kubernetes manifests in
// deploy/kubernetes against each other and against te: prefill and decode
// differ only in their KV role, the image's user is te-sidecar's user
// (and not forced on the serving container), te-sidecar's port is the
// probes' and the Service's, the Secret is mounted where
// TE_AUTH_SECRET_FILE points, the serving container asks for a GPU and is
// probed, the ServiceMonitor is an optional component and scrapes ports
// that exist. tests/deploy/schema checks the same files against the
// Kubernetes API's types. The image itself is not built here (no
// container engine runs on the build machines, and base images come from a
// registry they cannot reach); TestImageBuild builds and runs it where
// docker works.
package deploy
