package sidecar

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"slices"
	"strings"
	"sync"

	vm "github.com/VictoriaMetrics/metrics"
)

// Metrics is the sidecar's registry of counters, gauges and histograms,
// written in Prometheus' text exposition format (version 0.0.4). The series
// live in a github.com/VictoriaMetrics/metrics Set; this type adds what the
// sidecar needs on top: families with help texts and label names declared
// once, label values escaped, and a registration mistake that never panics.
// Safe for concurrent use.
type Metrics struct {
	set *vm.Set

	mu       sync.Mutex
	families map[string]*family
}

// NewMetrics returns an empty registry.
func NewMetrics() *Metrics { return &Metrics{set: vm.NewSet(), families: map[string]*family{}} }

type family struct {
	name, help, typ string
	labels          []string
	buckets         []float64 // histograms
	set             *vm.Set   // the registry's, a detached one after a clash, nil for an invalid name
}

// register returns the family called name, creating it; a second
// registration with the same name, type and label count returns the first.
// One that clashes gets a family in a set of its own that is never exported:
// a setup mistake must not take the daemon down, nor corrupt the exposition.
func (m *Metrics) register(f *family) *family {
	if vm.ValidateMetric(f.name) != nil || slices.ContainsFunc(f.labels, func(l string) bool {
		return vm.ValidateMetric(l) != nil || l == "le"
	}) {
		return f // series of an invalid name are dropped
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old := m.families[f.name]; old != nil {
		if old.typ != f.typ || len(old.labels) != len(f.labels) {
			f.set = vm.NewSet()
			return f
		}
		return old
	}
	f.set = m.set
	m.families[f.name] = f
	return f
}

// series returns the full series name for these label values.
func (f *family) series(values []string) string {
	if len(f.labels) == 0 {
		return f.name
	}
	var b strings.Builder
	b.WriteString(f.name)
	b.WriteByte('{')
	for i, n := range f.labels {
		if i > 0 {
			b.WriteByte(',')
		}
		v := ""
		// A programming error in a handler must not take the daemon down:
		// missing values are empty, extra ones are dropped.
		if i < len(values) {
			v = values[i]
		}
		b.WriteString(n + `="` + escapeValue(v) + `"`)
	}
	b.WriteByte('}')
	return b.String()
}

// Counter is a family of monotonically increasing values.
type Counter struct{ f *family }

// Counter registers a counter family with the given label names.
func (m *Metrics) Counter(name, help string, labels ...string) Counter {
	return Counter{m.register(&family{name: name, help: help, typ: "counter", labels: labels})}
}

// Add adds d (>= 0) to the series with these label values.
func (c Counter) Add(d float64, values ...string) {
	if d < 0 || math.IsNaN(d) || c.f.set == nil {
		return
	}
	c.f.set.GetOrCreateFloatCounter(c.f.series(values)).Add(d)
}

// Inc adds one.
func (c Counter) Inc(values ...string) { c.Add(1, values...) }

// Gauge is a family of values that go up and down.
type Gauge struct{ f *family }

// Gauge registers a gauge family.
func (m *Metrics) Gauge(name, help string, labels ...string) Gauge {
	return Gauge{m.register(&family{name: name, help: help, typ: "gauge", labels: labels})}
}

// Set sets the series with these label values.
func (g Gauge) Set(v float64, values ...string) {
	if g.f.set == nil {
		return
	}
	g.f.set.GetOrCreateGauge(g.f.series(values), nil).Set(v)
}

// Add adds d (may be negative).
func (g Gauge) Add(d float64, values ...string) {
	if g.f.set == nil {
		return
	}
	g.f.set.GetOrCreateGauge(g.f.series(values), nil).Add(d)
}

// GaugeFunc registers a gauge without labels read from f at each scrape.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	fam := m.register(&family{name: name, help: help, typ: "gauge"})
	if fam.set != nil {
		fam.set.GetOrCreateGauge(name, f)
	}
}

// CounterFunc registers a counter without labels read from f at each
// scrape (a count kept elsewhere).
func (m *Metrics) CounterFunc(name, help string, f func() float64) {
	fam := m.register(&family{name: name, help: help, typ: "counter"})
	if fam.set != nil {
		fam.set.GetOrCreateGauge(name, f)
	}
}

// Histogram is a family of distributions.
type Histogram struct{ f *family }

// DefBuckets suit request latencies in seconds.
var DefBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Histogram registers a histogram family with the given bucket bounds (in
// any order; duplicates and NaN are dropped).
func (m *Metrics) Histogram(name, help string, buckets []float64, labels ...string) Histogram {
	b := slices.DeleteFunc(slices.Clone(buckets), math.IsNaN)
	slices.Sort(b)
	b = slices.Compact(b)
	if len(b) == 0 {
		b = DefBuckets
	}
	return Histogram{m.register(&family{name: name, help: help, typ: "histogram", labels: labels, buckets: b})}
}

// Observe records v (negative values and NaN are ignored) in the series with
// these label values.
func (h Histogram) Observe(v float64, values ...string) {
	if h.f.set == nil {
		return
	}
	h.f.set.GetOrCreatePrometheusHistogramExt(h.f.series(values), h.f.buckets).Update(v)
}

// WriteTo writes every family that has a series in the text exposition
// format, sorted by name, each preceded by its HELP and TYPE lines.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	var samples bytes.Buffer
	m.set.WritePrometheus(&samples)
	m.mu.Lock()
	families := m.families
	cw := &countWriter{w: w}
	bw := bufio.NewWriter(cw)
	cur := ""
	for line := range bytes.Lines(samples.Bytes()) {
		name := familyOf(families, string(line))
		if name != cur {
			if f := families[name]; f != nil {
				bw.WriteString("# HELP " + f.name + " " + escapeHelp(f.help) + "\n")
				bw.WriteString("# TYPE " + f.name + " " + f.typ + "\n")
			}
			cur = name
		}
		bw.Write(line)
	}
	m.mu.Unlock()
	err := bw.Flush()
	return cw.n, err
}

// familyOf returns the family a sample line belongs to: the metric name,
// without a histogram's _bucket, _sum or _count suffix.
func familyOf(families map[string]*family, line string) string {
	end := strings.IndexAny(line, "{ ")
	if end < 0 {
		end = len(line)
	}
	name := line[:end]
	if families[name] != nil {
		return name
	}
	for _, sfx := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, sfx); ok {
			if f := families[base]; f != nil && f.typ == "histogram" {
				return base
			}
		}
	}
	return name
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

var (
	valueEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

func escapeValue(s string) string { return valueEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
