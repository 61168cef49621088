package schema

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const dir = "../../../deploy/kubernetes"

// build runs kustomize on dir/sub as kubectl apply -k would and returns
// each object it emits as YAML, by kind.
func build(t *testing.T, sub string) map[string][][]byte {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join(dir, sub))
	if err != nil {
		t.Fatal(err)
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	res, err := k.Run(filesys.MakeFsOnDisk(), abs)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", sub, err)
	}
	out := map[string][][]byte{}
	for _, r := range res.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		out[r.GetKind()] = append(out[r.GetKind()], b)
	}
	return out
}

// strict decodes b into v, refusing unknown fields and duplicate keys.
func strict(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := yaml.UnmarshalStrict(b, v); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
}

// TestBaseWithoutOperator: the base builds, holds prefill and decode
// (a Deployment and a Service each) and nothing of the Prometheus
// Operator, so kubectl apply -k works on any cluster.
func TestBaseWithoutOperator(t *testing.T) {
	objs := build(t, ".")
	if len(objs["ServiceMonitor"]) != 0 {
		t.Error("the base has a ServiceMonitor: clusters without the Prometheus Operator refuse it")
	}
	if len(objs["Deployment"]) != 2 || len(objs["Service"]) != 2 || len(objs) != 2 {
		t.Errorf("the base builds %d Deployments, %d Services, kinds %v: want prefill's and decode's", len(objs["Deployment"]),
			len(objs["Service"]), keys(objs))
	}
	var deps []appsv1.Deployment
	for _, b := range objs["Deployment"] {
		var d appsv1.Deployment
		strict(t, b, &d)
		checkDeployment(t, &d)
		deps = append(deps, d)
	}
	for _, b := range objs["Service"] {
		var s corev1.Service
		strict(t, b, &s)
		checkService(t, &s, deps)
	}
}

// TestWithMonitoring: the overlay adds the ServiceMonitor component to the
// base, valid against the operator's types, selecting both Services.
func TestWithMonitoring(t *testing.T) {
	objs := build(t, "with-monitoring")
	if len(objs["ServiceMonitor"]) != 1 || len(objs["Deployment"]) != 2 || len(objs["Service"]) != 2 {
		t.Fatalf("with-monitoring builds kinds %v: want the base and one ServiceMonitor", keys(objs))
	}
	var sm monitoringv1.ServiceMonitor
	strict(t, objs["ServiceMonitor"][0], &sm)
	if sm.APIVersion != "monitoring.coreos.com/v1" || len(sm.Spec.Endpoints) == 0 {
		t.Errorf("ServiceMonitor %s: apiVersion %q, %d endpoints", sm.Name, sm.APIVersion, len(sm.Spec.Endpoints))
	}
	for _, b := range objs["Service"] {
		var s corev1.Service
		strict(t, b, &s)
		for k, v := range sm.Spec.Selector.MatchLabels {
			if s.Labels[k] != v {
				t.Errorf("the ServiceMonitor does not select Service %s (%s=%s)", s.Name, k, v)
			}
		}
	}
}

func keys(m map[string][][]byte) []string {
	var out []string
	for k, v := range m {
		out = append(out, fmt.Sprintf("%s×%d", k, len(v)))
	}
	return out
}

// checkDeployment checks what the API server requires of a Deployment
// beyond its field types: a selector matching the template's labels,
// named containers with images, unique port names that probes and
// mounts refer to, volumes that exist, quantities that parse.
func checkDeployment(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	if d.APIVersion != "apps/v1" || d.Name == "" {
		t.Errorf("Deployment %q: apiVersion %q", d.Name, d.APIVersion)
	}
	if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 {
		t.Fatalf("Deployment %s: no selector", d.Name)
	}
	for k, v := range d.Spec.Selector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("Deployment %s: selector %s=%s does not match the template's labels", d.Name, k, v)
		}
	}
	pod := d.Spec.Template.Spec
	volumes := map[string]bool{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = true
	}
	if len(pod.Containers) == 0 {
		t.Fatalf("Deployment %s: no containers", d.Name)
	}
	for _, c := range pod.Containers {
		where := d.Name + "/" + c.Name
		if c.Name == "" || c.Image == "" {
			t.Errorf("%s: a container needs a name and an image", where)
		}
		ports := map[string]bool{}
		for _, p := range c.Ports {
			if p.ContainerPort < 1 || p.ContainerPort > 65535 || ports[p.Name] {
				t.Errorf("%s: port %s %d", where, p.Name, p.ContainerPort)
			}
			ports[p.Name] = true
		}
		for _, m := range c.VolumeMounts {
			if !volumes[m.Name] || !strings.HasPrefix(m.MountPath, "/") {
				t.Errorf("%s: mount %s at %q: no such volume, or not an absolute path", where, m.Name, m.MountPath)
			}
		}
		for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe, "startup": c.StartupProbe} {
			if p == nil {
				continue
			}
			if p.HTTPGet == nil {
				t.Errorf("%s: %s probe has no httpGet", where, name)
				continue
			}
			if port := p.HTTPGet.Port; port.StrVal != "" && !ports[port.StrVal] {
				t.Errorf("%s: %s probe on port %q, which the container does not name", where, name, port.StrVal)
			}
		}
		for name, q := range c.Resources.Limits {
			if r, ok := c.Resources.Requests[name]; ok && r.Cmp(q) > 0 {
				t.Errorf("%s: requests %s %s over its limit %s", where, name, r.String(), q.String())
			}
		}
		if gpu, ok := c.Resources.Limits["nvidia.com/gpu"]; ok {
			if r := c.Resources.Requests["nvidia.com/gpu"]; r.Cmp(gpu) != 0 {
				t.Errorf("%s: an extended resource (nvidia.com/gpu) needs requests equal to limits", where)
			}
		}
	}
}

// checkService: the Service selects one of the Deployments' pods and
// targets ports its containers name.
func checkService(t *testing.T, s *corev1.Service, deps []appsv1.Deployment) {
	t.Helper()
	for _, d := range deps {
		match := len(s.Spec.Selector) > 0
		for k, v := range s.Spec.Selector {
			match = match && d.Spec.Template.Labels[k] == v
		}
		if !match {
			continue
		}
		named := map[string]bool{}
		for _, c := range d.Spec.Template.Spec.Containers {
			for _, p := range c.Ports {
				named[p.Name] = true
			}
		}
		for _, p := range s.Spec.Ports {
			if p.Port < 1 || p.Port > 65535 || (p.TargetPort.StrVal != "" && !named[p.TargetPort.StrVal]) {
				t.Errorf("Service %s: port %s %d targets %q, which %s does not name", s.Name, p.Name, p.Port, p.TargetPort.StrVal, d.Name)
			}
		}
		return
	}
	t.Errorf("Service %s selects no Deployment's pods", s.Name)
}
