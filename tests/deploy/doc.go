// Package deploy checks the Dockerfile and the Kubernetes manifests in
// deploy/kubernetes against each other and against te: the image's user is
// the pods' user, te-sidecar's port is the probes' and the Service's, the
// Secret is mounted where TE_AUTH_SECRET_FILE points, the ServiceMonitor
// scrapes ports that exist. The image itself is not built here (no
// container engine runs on the build machines, and base images come from a
// registry they cannot reach); TestImageBuild builds and runs it where
// docker works.
package deploy
