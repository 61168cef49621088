package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v2"
)

const root = "../.."

// obj is a decoded manifest: YAML maps become map[string]any through JSON,
// so field access is plain.
type obj = map[string]any

func decodeAll(t *testing.T, path string) []obj {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []obj
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.SetStrict(true) // a key written twice is an error
	for {
		var v any
		if err := dec.Decode(&v); err != nil {
			if err.Error() == "EOF" {
				break
			}
			t.Fatalf("%s: %v", path, err)
		}
		if v == nil {
			continue
		}
		j, err := json.Marshal(jsonable(v))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var o obj
		if err := json.Unmarshal(j, &o); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		out = append(out, o)
	}
	return out
}

// jsonable turns yaml.v2's map[any]any into map[string]any.
func jsonable(v any) any {
	switch x := v.(type) {
	case map[any]any:
		m := map[string]any{}
		for k, e := range x {
			m[k.(string)] = jsonable(e)
		}
		return m
	case []any:
		for i := range x {
			x[i] = jsonable(x[i])
		}
	}
	return v
}

func get(o any, path ...string) any {
	for _, p := range path {
		m, ok := o.(obj)
		if !ok {
			return nil
		}
		o = m[p]
	}
	return o
}

func str(o any, path ...string) string { s, _ := get(o, path...).(string); return s }
func list(o any, path ...string) []any { l, _ := get(o, path...).([]any); return l }

func named(l []any, name string) obj {
	for _, e := range l {
		if m, ok := e.(obj); ok && m["name"] == name {
			return m
		}
	}
	return nil
}

var dns1123 = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

type manifests struct {
	deployment, service, monitor obj
	files                        []string
}

func load(t *testing.T) manifests {
	t.Helper()
	dir := filepath.Join(root, "deploy", "kubernetes")
	kust := decodeAll(t, filepath.Join(dir, "kustomization.yaml"))
	if len(kust) != 1 || str(kust[0], "kind") != "Kustomization" {
		t.Fatalf("kustomization.yaml: %v", kust)
	}
	var m manifests
	var listed []string
	for _, r := range list(kust[0], "resources") {
		listed = append(listed, r.(string))
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		base := filepath.Base(f)
		if base == "kustomization.yaml" {
			continue
		}
		if !slices.Contains(listed, base) {
			t.Errorf("%s is not in kustomization.yaml's resources", base)
		}
		m.files = append(m.files, base)
		for _, o := range decodeAll(t, f) {
			kind, api, name := str(o, "kind"), str(o, "apiVersion"), str(o, "metadata", "name")
			if !dns1123.MatchString(name) || len(name) > 63 {
				t.Errorf("%s: %s name %q is not a DNS-1123 label", base, kind, name)
			}
			want := map[string]string{"Deployment": "apps/v1", "Service": "v1", "ServiceMonitor": "monitoring.coreos.com/v1"}[kind]
			if want == "" || api != want {
				t.Errorf("%s: kind %q apiVersion %q (want one of Deployment, Service, ServiceMonitor with their API)", base, kind, api)
			}
			switch kind {
			case "Deployment":
				m.deployment = o
			case "Service":
				m.service = o
			case "ServiceMonitor":
				m.monitor = o
			}
		}
	}
	for _, l := range listed {
		if _, err := os.Stat(filepath.Join(dir, l)); err != nil {
			t.Errorf("kustomization.yaml lists %s: %v", l, err)
		}
	}
	if m.deployment == nil || m.service == nil || m.monitor == nil {
		t.Fatalf("want a Deployment, a Service and a ServiceMonitor in %v", m.files)
	}
	return m
}

func env(c obj, name string) string {
	e := named(list(c, "env"), name)
	if e == nil {
		return ""
	}
	return str(e, "value")
}

// containerPorts maps port names to numbers for the pod's containers.
func containerPorts(t *testing.T, pod obj) map[string]int {
	out := map[string]int{}
	for _, c := range list(pod, "containers") {
		for _, p := range list(c, "ports") {
			name := str(p, "name")
			if len(name) > 15 || !dns1123.MatchString(name) {
				t.Errorf("container port name %q: at most 15 characters, DNS-1123", name)
			}
			out[name] = int(get(p, "containerPort").(float64))
		}
	}
	return out
}

// TestDeployment: te-sidecar is a sidecar container of the serving pod, both
// read the cluster secret from one mounted Secret, te-sidecar is probed on
// /healthz at the port it listens on, and everything runs as the image's
// unprivileged user.
func TestDeployment(t *testing.T) {
	m := load(t)
	pod := get(m.deployment, "spec", "template", "spec").(obj)
	labels := get(m.deployment, "spec", "template", "metadata", "labels").(obj)
	for k, v := range get(m.deployment, "spec", "selector", "matchLabels").(obj) {
		if labels[k] != v {
			t.Errorf("selector %s=%v does not match the pod's labels", k, v)
		}
	}
	ports := containerPorts(t, pod)
	side := named(list(pod, "containers"), "te-sidecar")
	server := named(list(pod, "containers"), "server")
	if side == nil || server == nil {
		t.Fatal("want containers server and te-sidecar")
	}

	// The secret: a Secret volume, mounted read-only in both containers
	// where TE_AUTH_SECRET_FILE points.
	vol := named(list(pod, "volumes"), "te-secret")
	if str(vol, "secret", "secretName") == "" {
		t.Fatal("volume te-secret is not a Secret")
	}
	mode, _ := get(vol, "secret", "defaultMode").(float64)
	if int(mode)&0o007 != 0 {
		t.Errorf("the Secret's files are readable by others (mode %o)", int(mode))
	}
	for _, c := range []obj{side, server} {
		f := env(c, "TE_AUTH_SECRET_FILE")
		mnt := named(list(c, "volumeMounts"), "te-secret")
		if f == "" || mnt == nil || !strings.HasPrefix(f, str(mnt, "mountPath")+"/") || get(mnt, "readOnly") != true {
			t.Errorf("container %s: TE_AUTH_SECRET_FILE %q not in a read-only mount of te-secret (%v)", c["name"], f, mnt)
		}
		if get(c, "securityContext", "allowPrivilegeEscalation") != false {
			t.Errorf("container %s may escalate privileges", c["name"])
		}
	}

	// te-sidecar listens where it is probed.
	addr := ""
	for _, a := range list(side, "args") {
		if v, ok := strings.CutPrefix(a.(string), "-addr="); ok {
			addr = v
		}
	}
	_, port, _ := strings.Cut(addr, ":")
	if ports["te-sidecar"] == 0 || strconv.Itoa(ports["te-sidecar"]) != port {
		t.Errorf("te-sidecar listens on %q, its container port is %d", addr, ports["te-sidecar"])
	}
	for _, probe := range []string{"livenessProbe", "readinessProbe"} {
		if str(side, probe, "httpGet", "path") != "/healthz" || str(side, probe, "httpGet", "port") != "te-sidecar" {
			t.Errorf("%s: want httpGet /healthz on port te-sidecar, got %v", probe, get(side, probe))
		}
	}
	if get(side, "securityContext", "readOnlyRootFilesystem") != true {
		t.Error("te-sidecar's root file system is writable")
	}

	// The engine's metrics port is the container port the Service targets.
	_, mport, _ := strings.Cut(env(server, "TE_METRICS_ADDR"), ":")
	first, _, _ := strings.Cut(mport, "-")
	if strconv.Itoa(ports["te-metrics"]) != first {
		t.Errorf("TE_METRICS_ADDR %q, container port te-metrics %d", env(server, "TE_METRICS_ADDR"), ports["te-metrics"])
	}

	// The pod runs as the image's user, not root.
	uid := dockerUser(t)
	if get(pod, "securityContext", "runAsNonRoot") != true || strconv.Itoa(int(get(pod, "securityContext", "runAsUser").(float64))) != uid ||
		strconv.Itoa(int(get(pod, "securityContext", "fsGroup").(float64))) != uid {
		t.Errorf("pod securityContext %v: want runAsNonRoot, runAsUser and fsGroup %s (the Dockerfile's USER)",
			get(pod, "securityContext"), uid)
	}
}

// TestServiceAndMonitor: the Service selects the pod and targets ports that
// exist; the ServiceMonitor selects the Service and scrapes /metrics on
// ports the Service has.
func TestServiceAndMonitor(t *testing.T) {
	m := load(t)
	labels := get(m.deployment, "spec", "template", "metadata", "labels").(obj)
	for k, v := range get(m.service, "spec", "selector").(obj) {
		if labels[k] != v {
			t.Errorf("Service selector %s=%v matches no pod label", k, v)
		}
	}
	ports := containerPorts(t, get(m.deployment, "spec", "template", "spec").(obj))
	svcPorts := map[string]bool{}
	for _, p := range list(m.service, "spec", "ports") {
		svcPorts[str(p, "name")] = true
		if target := str(p, "targetPort"); ports[target] == 0 {
			t.Errorf("Service port %s targets %q, which no container names", str(p, "name"), target)
		}
	}
	svcLabels := get(m.service, "metadata", "labels").(obj)
	for k, v := range get(m.monitor, "spec", "selector", "matchLabels").(obj) {
		if svcLabels[k] != v {
			t.Errorf("ServiceMonitor selects %s=%v, which the Service lacks", k, v)
		}
	}
	scraped := map[string]bool{}
	for _, e := range list(m.monitor, "spec", "endpoints") {
		if str(e, "path") != "/metrics" || !svcPorts[str(e, "port")] {
			t.Errorf("ServiceMonitor endpoint %v: want path /metrics on a Service port", e)
		}
		scraped[str(e, "port")] = true
	}
	if !scraped["te-sidecar"] || !scraped["te-metrics"] {
		t.Errorf("the ServiceMonitor scrapes %v; want te-sidecar and te-metrics", scraped)
	}
}

// dockerUser returns the numeric user of the Dockerfile's last stage.
func dockerUser(t *testing.T) string {
	t.Helper()
	stages := dockerStages(t)
	last := stages[len(stages)-1]
	for i := len(last) - 1; i >= 0; i-- {
		if u, ok := strings.CutPrefix(last[i], "USER "); ok {
			uid, _, _ := strings.Cut(strings.TrimSpace(u), ":")
			return uid
		}
	}
	t.Fatal("the Dockerfile's last stage sets no USER")
	return ""
}

// dockerStages returns the Dockerfile's instructions (continuation lines
// joined) per stage.
func dockerStages(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]string
	var cur strings.Builder
	for _, line := range strings.Split(string(b), "\n") {
		trim := strings.TrimSpace(line)
		if cur.Len() == 0 && (trim == "" || strings.HasPrefix(trim, "#")) {
			continue
		}
		if strings.HasPrefix(trim, "#") {
			continue // a comment inside a continued instruction
		}
		cont := strings.HasSuffix(trim, `\`)
		cur.WriteString(strings.TrimSuffix(trim, `\`) + " ")
		if cont {
			continue
		}
		ins := strings.Join(strings.Fields(cur.String()), " ")
		cur.Reset()
		if strings.HasPrefix(ins, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], ins)
		}
	}
	return stages
}

// TestDockerfile checks what hadolint would and what the manifests rely on:
// a multi-stage build whose runtime stage is Debian slim, runs as a numeric
// non-root user, installs packages without recommends and cleans apt's
// lists, copies te-sidecar and libte.so from the build stage, and starts
// te-sidecar in exec form; every COPY source from the context exists.
func TestDockerfile(t *testing.T) {
	stages := dockerStages(t)
	if len(stages) < 2 {
		t.Fatalf("%d stages: want a build stage and a runtime stage", len(stages))
	}
	args := map[string]string{}
	b, _ := os.ReadFile(filepath.Join(root, "Dockerfile"))
	for _, m := range regexp.MustCompile(`(?m)^ARG (\w+)=(\S+)`).FindAllStringSubmatch(string(b), -1) {
		args[m[1]] = m[2]
	}
	expand := func(s string) string {
		return regexp.MustCompile(`\$\{(\w+)\}`).ReplaceAllStringFunc(s, func(v string) string { return args[v[2:len(v)-1]] })
	}
	if from := expand(stages[0][0]); !strings.HasPrefix(from, "FROM golang:") || !strings.Contains(from, "bookworm") || !strings.HasSuffix(from, " AS build") {
		t.Errorf("build stage %q: want a Debian (bookworm) Go image named build", from)
	}
	last := stages[len(stages)-1]
	if from := expand(last[0]); !strings.HasPrefix(from, "FROM debian:") || !strings.HasSuffix(from, "-slim") {
		t.Errorf("runtime stage %q: want debian:*-slim", from)
	}
	var user, entry string
	var copies []string
	for _, stage := range stages {
		for _, ins := range stage {
			if strings.HasPrefix(ins, "RUN ") && strings.Contains(ins, "apt-get install") {
				if !strings.Contains(ins, "--no-install-recommends") || !strings.Contains(ins, "rm -rf /var/lib/apt/lists/*") {
					t.Errorf("%q: install with --no-install-recommends and remove /var/lib/apt/lists", ins)
				}
			}
			if strings.HasPrefix(ins, "ADD ") {
				t.Errorf("%q: use COPY", ins)
			}
			if f, ok := strings.CutPrefix(ins, "COPY "); ok && !strings.HasPrefix(f, "--from=") {
				srcs := strings.Fields(f)
				for _, s := range srcs[:len(srcs)-1] {
					if _, err := os.Stat(filepath.Join(root, s)); err != nil {
						t.Errorf("COPY %s: not in the build context: %v", s, err)
					}
				}
			}
		}
	}
	for _, ins := range last {
		switch {
		case strings.HasPrefix(ins, "USER "):
			user = strings.TrimPrefix(ins, "USER ")
		case strings.HasPrefix(ins, "ENTRYPOINT "):
			entry = strings.TrimPrefix(ins, "ENTRYPOINT ")
		case strings.HasPrefix(ins, "COPY --from=build "):
			copies = append(copies, ins)
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("USER %q: want a numeric non-root user (Kubernetes checks runAsNonRoot by number)", user)
	}
	var ep []string
	if err := json.Unmarshal([]byte(entry), &ep); err != nil || len(ep) == 0 || filepath.Base(ep[0]) != "te-sidecar" {
		t.Errorf("ENTRYPOINT %s: want the exec form running te-sidecar", entry)
	}
	build := strings.Join(stages[0], "\n")
	for _, want := range []string{"build/te-sidecar", "build/libte.so", "include/te.h", "--target /out/te/python"} {
		if !strings.Contains(build, want) {
			t.Errorf("the build stage does not handle %s", want)
		}
	}
	if len(copies) == 0 {
		t.Error("the runtime stage copies nothing from the build stage")
	}
	ignore, _ := os.ReadFile(filepath.Join(root, ".dockerignore"))
	if !strings.Contains(string(ignore), "build/") {
		t.Error(".dockerignore does not leave build/ out of the context")
	}
}

// TestImageBuild builds the image and runs te-sidecar -version in it, where
// a container engine works and can pull the base images; elsewhere it says
// why it did not.
func TestImageBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a container image")
	}
	docker, err := exec.LookPath("docker")
	if err != nil {
		t.Skip("no docker client")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, docker, "info").CombinedOutput(); err != nil {
		t.Skipf("no container engine answers docker info (%v): the image is checked by TestDockerfile only: %s",
			err, firstLine(out))
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	tag := "te-deploy-test:" + strconv.Itoa(os.Getpid())
	build := exec.CommandContext(ctx, docker, "build", "--build-arg", "TE_VERSION=0.0.0+test", "-t", tag, root)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docker build: %v\n%s", err, out)
	}
	defer exec.Command(docker, "rmi", "-f", tag).Run()
	out, err := exec.CommandContext(ctx, docker, "run", "--rm", tag, "-version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "0.0.0+test") {
		t.Fatalf("te-sidecar -version in the image: %v: %s", err, out)
	}
	out, err = exec.CommandContext(ctx, docker, "run", "--rm", "--entrypoint", "python3", tag, "-c",
		"import te, mooncake.engine; print(te.__version__, te.version())").CombinedOutput()
	if err != nil || strings.Count(string(out), "0.0.0+test") != 2 {
		t.Fatalf("te in the image: %v: %s", err, out)
	}
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
