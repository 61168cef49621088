package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
	deployments, services map[string]obj // by metadata.name
	monitor               obj
}

// load reads the resources of base/ (what deploy/kubernetes applies) and
// of the monitoring component: every file listed exists, every manifest file is listed
// by one of them, and the base does not need the Prometheus Operator.
func load(t *testing.T) manifests {
	t.Helper()
	dir := filepath.Join(root, "deploy", "kubernetes")
	m := manifests{deployments: map[string]obj{}, services: map[string]obj{}}
	listed := map[string]bool{}
	for _, k := range []struct{ dir, kind, field string }{
		{"base", "Kustomization", "resources"}, {"monitoring", "Component", "resources"},
	} {
		kust := decodeAll(t, filepath.Join(dir, k.dir, "kustomization.yaml"))
		if len(kust) != 1 || str(kust[0], "kind") != k.kind {
			t.Fatalf("%s/kustomization.yaml: want one %s, got %v", k.dir, k.kind, kust)
		}
		for _, r := range list(kust[0], k.field) {
			base := filepath.Join(k.dir, r.(string))
			listed[base] = true
			for _, o := range decodeAll(t, filepath.Join(dir, base)) {
				kind, api, name := str(o, "kind"), str(o, "apiVersion"), str(o, "metadata", "name")
				if !dns1123.MatchString(name) || len(name) > 63 {
					t.Errorf("%s: %s name %q is not a DNS-1123 label", base, kind, name)
				}
				want := map[string]string{"Deployment": "apps/v1", "Service": "v1", "ServiceMonitor": "monitoring.coreos.com/v1"}[kind]
				if want == "" || api != want {
					t.Errorf("%s: kind %q apiVersion %q (want one of Deployment, Service, ServiceMonitor with their API)", base, kind, api)
				}
				switch {
				case kind == "ServiceMonitor" && k.dir == "base":
					t.Errorf("%s: a ServiceMonitor in the base needs the Prometheus Operator: it belongs in monitoring/", base)
				case kind == "Deployment":
					m.deployments[name] = o
				case kind == "Service":
					m.services[name] = o
				case kind == "ServiceMonitor":
					m.monitor = o
				}
			}
		}
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*.yaml"))
	for _, f := range files {
		rel, _ := filepath.Rel(dir, f)
		if filepath.Base(rel) != "kustomization.yaml" && !listed[rel] {
			t.Errorf("%s is in no kustomization's resources", rel)
		}
	}
	if m.deployments["llm-prefill"] == nil || m.deployments["llm-decode"] == nil || m.monitor == nil {
		t.Fatalf("want Deployments llm-prefill and llm-decode and a ServiceMonitor; have %d Deployments", len(m.deployments))
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

func num(v any) (int, bool) {
	switch x := v.(type) {
	case float64:
		return int(x), true
	case string:
		n, err := strconv.Atoi(x)
		return n, err == nil
	}
	return 0, false
}

// TestDeployment: prefill and decode are the same pod but for the KV role:
// te-sidecar is a sidecar container of the serving pod, both read the
// cluster secret from one mounted Secret, te-sidecar is probed on /healthz
// at the port it listens on and runs as the image's unprivileged user
// (set on its container: the serving image keeps its own user), and the
// serving container asks for a GPU, CPU and memory and is probed.
func TestDeployment(t *testing.T) {
	m := load(t)
	for name, role := range map[string]string{"llm-prefill": "kv_producer", "llm-decode": "kv_consumer"} {
		t.Run(name, func(t *testing.T) { checkDeployment(t, m.deployments[name], role) })
	}
}

func checkDeployment(t *testing.T, d obj, role string) {
	pod := get(d, "spec", "template", "spec").(obj)
	labels := get(d, "spec", "template", "metadata", "labels").(obj)
	for k, v := range get(d, "spec", "selector", "matchLabels").(obj) {
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
	roleSeen := false
	for _, a := range list(server, "args") {
		roleSeen = roleSeen || strings.Contains(a.(string), `"kv_role":"`+role+`"`)
	}
	if !roleSeen {
		t.Errorf("the server's args do not set kv_role %s: %v", role, list(server, "args"))
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

	// te-sidecar runs as the image's user, not root; the pod does not
	// force a user on the serving container, and its fsGroup lets
	// te-sidecar read the Secret.
	uid := dockerUser(t)
	sc := get(side, "securityContext")
	if get(sc, "runAsNonRoot") != true || fmt.Sprint(get(sc, "runAsUser")) != uid {
		t.Errorf("te-sidecar securityContext %v: want runAsNonRoot and runAsUser %s (the Dockerfile's USER)", sc, uid)
	}
	for _, k := range []string{"runAsUser", "runAsGroup", "runAsNonRoot"} {
		if get(pod, "securityContext", k) != nil {
			t.Errorf("the pod's securityContext sets %s, which applies to the serving container too: set it on te-sidecar", k)
		}
	}
	if fmt.Sprint(get(pod, "securityContext", "fsGroup")) != uid {
		t.Errorf("pod fsGroup %v: want %s, so te-sidecar can read the Secret", get(pod, "securityContext", "fsGroup"), uid)
	}

	// The serving container: a GPU (requests and limits equal, as the
	// device plugin requires), CPU and memory, and probes on its port.
	if g, ok := num(get(server, "resources", "limits", "nvidia.com/gpu")); !ok || g < 1 ||
		fmt.Sprint(get(server, "resources", "requests", "nvidia.com/gpu")) != fmt.Sprint(get(server, "resources", "limits", "nvidia.com/gpu")) {
		t.Errorf("server resources %v: want nvidia.com/gpu >= 1 in limits and the same in requests", get(server, "resources"))
	}
	for _, r := range []string{"cpu", "memory"} {
		if get(server, "resources", "requests", r) == nil {
			t.Errorf("the server requests no %s", r)
		}
	}
	for _, probe := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
		p := str(server, probe, "httpGet", "port")
		if str(server, probe, "httpGet", "path") == "" || ports[p] == 0 {
			t.Errorf("server %s %v: want an httpGet on a port the pod declares", probe, get(server, probe))
		}
	}
}

// TestServiceAndMonitor: each Deployment has a Service that selects its
// pods and targets ports that exist; the ServiceMonitor selects every
// Service and scrapes /metrics on ports they have.
func TestServiceAndMonitor(t *testing.T) {
	m := load(t)
	svcLabelsOK := 0
	for name, d := range m.deployments {
		svc := m.services[name]
		if svc == nil {
			t.Errorf("Deployment %s has no Service of its name", name)
			continue
		}
		labels := get(d, "spec", "template", "metadata", "labels").(obj)
		for k, v := range get(svc, "spec", "selector").(obj) {
			if labels[k] != v {
				t.Errorf("Service %s selector %s=%v matches no pod label", name, k, v)
			}
		}
		ports := containerPorts(t, get(d, "spec", "template", "spec").(obj))
		svcPorts := map[string]bool{}
		for _, p := range list(svc, "spec", "ports") {
			svcPorts[str(p, "name")] = true
			if target := str(p, "targetPort"); ports[target] == 0 {
				t.Errorf("Service %s port %s targets %q, which no container names", name, str(p, "name"), target)
			}
		}
		svcLabels := get(svc, "metadata", "labels").(obj)
		selected := true
		for k, v := range get(m.monitor, "spec", "selector", "matchLabels").(obj) {
			selected = selected && svcLabels[k] == v
		}
		if !selected {
			t.Errorf("the ServiceMonitor does not select Service %s", name)
			continue
		}
		svcLabelsOK++
		scraped := map[string]bool{}
		for _, e := range list(m.monitor, "spec", "endpoints") {
			if str(e, "path") != "/metrics" || !svcPorts[str(e, "port")] {
				t.Errorf("ServiceMonitor endpoint %v: want path /metrics on a port of Service %s", e, name)
			}
			scraped[str(e, "port")] = true
		}
		if !scraped["te-sidecar"] || !scraped["te-metrics"] {
			t.Errorf("the ServiceMonitor scrapes %v; want te-sidecar and te-metrics", scraped)
		}
	}
	if svcLabelsOK != 2 {
		t.Errorf("the ServiceMonitor selects %d Services, want prefill's and decode's", svcLabelsOK)
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
