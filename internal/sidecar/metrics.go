package sidecar

import (
	"bufio"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Metrics is a small registry of counters, gauges and histograms written in
// Prometheus' text exposition format (version 0.0.4). It is hand-written
// because the sidecar needs a handful of series, not client_golang's
// dependency tree. Safe for concurrent use.
type Metrics struct {
	mu       sync.Mutex
	families map[string]*family
}

// NewMetrics returns an empty registry.
func NewMetrics() *Metrics { return &Metrics{families: map[string]*family{}} }

type family struct {
	name, help, typ string
	labels          []string
	buckets         []float64 // histograms
	fn              func() float64

	mu     sync.Mutex
	series map[string]*series // by joined label values
}

type series struct {
	values []string
	v      atomic.Uint64 // float64 bits: counter or gauge value
	counts []atomic.Uint64
	sum    atomic.Uint64
	count  atomic.Uint64
}

func addFloat(u *atomic.Uint64, d float64) {
	for {
		old := u.Load()
		if u.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+d)) {
			return
		}
	}
}

// register returns the family called name, creating it; a second
// registration with the same name and type returns the first. One with
// another type gets a family that is never exported (a setup mistake must not
// take the daemon down, nor corrupt the exposition).
func (m *Metrics) register(f *family) *family {
	m.mu.Lock()
	defer m.mu.Unlock()
	f.series = map[string]*series{}
	if old := m.families[f.name]; old != nil {
		if old.typ != f.typ || len(old.labels) != len(f.labels) {
			return f
		}
		return old
	}
	m.families[f.name] = f
	return f
}

func (f *family) with(values []string) *series {
	if len(values) != len(f.labels) {
		// A programming error in a handler must not take the daemon down:
		// pad or cut to the declared labels.
		v := make([]string, len(f.labels))
		copy(v, values)
		values = v
	}
	key := strings.Join(values, "\xff")
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.series[key]
	if s == nil {
		s = &series{values: append([]string(nil), values...)}
		if f.buckets != nil {
			s.counts = make([]atomic.Uint64, len(f.buckets))
		}
		f.series[key] = s
	}
	return s
}

// Counter is a family of monotonically increasing values.
type Counter struct{ f *family }

// Counter registers a counter family with the given label names.
func (m *Metrics) Counter(name, help string, labels ...string) Counter {
	return Counter{m.register(&family{name: name, help: help, typ: "counter", labels: labels})}
}

// Add adds d (>= 0) to the series with these label values.
func (c Counter) Add(d float64, values ...string) {
	if d < 0 {
		return
	}
	addFloat(&c.f.with(values).v, d)
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
func (g Gauge) Set(v float64, values ...string) { g.f.with(values).v.Store(math.Float64bits(v)) }

// Add adds d (may be negative).
func (g Gauge) Add(d float64, values ...string) { addFloat(&g.f.with(values).v, d) }

// GaugeFunc registers a gauge without labels read from f at each scrape.
func (m *Metrics) GaugeFunc(name, help string, f func() float64) {
	m.register(&family{name: name, help: help, typ: "gauge", fn: f})
}

// Histogram is a family of distributions.
type Histogram struct{ f *family }

// DefBuckets suit request latencies in seconds.
var DefBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// Histogram registers a histogram family with ascending bucket bounds.
func (m *Metrics) Histogram(name, help string, buckets []float64, labels ...string) Histogram {
	b := append([]float64(nil), buckets...)
	sort.Float64s(b)
	return Histogram{m.register(&family{name: name, help: help, typ: "histogram", labels: labels, buckets: b})}
}

// Observe records v in the series with these label values.
func (h Histogram) Observe(v float64, values ...string) {
	s := h.f.with(values)
	for i, b := range h.f.buckets {
		if v <= b {
			s.counts[i].Add(1)
		}
	}
	s.count.Add(1)
	addFloat(&s.sum, v)
}

// WriteTo writes every family in the text exposition format, sorted by name.
func (m *Metrics) WriteTo(w io.Writer) (int64, error) {
	m.mu.Lock()
	fs := make([]*family, 0, len(m.families))
	for _, f := range m.families {
		fs = append(fs, f)
	}
	m.mu.Unlock()
	sort.Slice(fs, func(i, j int) bool { return fs[i].name < fs[j].name })
	cw := &countWriter{w: w}
	bw := bufio.NewWriter(cw)
	for _, f := range fs {
		bw.WriteString("# HELP " + f.name + " " + escapeHelp(f.help) + "\n")
		bw.WriteString("# TYPE " + f.name + " " + f.typ + "\n")
		if f.fn != nil {
			bw.WriteString(f.name + " " + fmtFloat(f.fn()) + "\n")
			continue
		}
		f.mu.Lock()
		ss := make([]*series, 0, len(f.series))
		for _, s := range f.series {
			ss = append(ss, s)
		}
		f.mu.Unlock()
		sort.Slice(ss, func(i, j int) bool {
			return strings.Join(ss[i].values, "\xff") < strings.Join(ss[j].values, "\xff")
		})
		for _, s := range ss {
			if f.buckets == nil {
				bw.WriteString(f.name + labelSet(f.labels, s.values, "", "") + " " +
					fmtFloat(math.Float64frombits(s.v.Load())) + "\n")
				continue
			}
			for i, b := range f.buckets {
				bw.WriteString(f.name + "_bucket" + labelSet(f.labels, s.values, "le", fmtFloat(b)) + " " +
					strconv.FormatUint(s.counts[i].Load(), 10) + "\n")
			}
			n := strconv.FormatUint(s.count.Load(), 10)
			bw.WriteString(f.name + "_bucket" + labelSet(f.labels, s.values, "le", "+Inf") + " " + n + "\n")
			bw.WriteString(f.name + "_sum" + labelSet(f.labels, s.values, "", "") + " " +
				fmtFloat(math.Float64frombits(s.sum.Load())) + "\n")
			bw.WriteString(f.name + "_count" + labelSet(f.labels, s.values, "", "") + " " + n + "\n")
		}
	}
	err := bw.Flush()
	return cw.n, err
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

func labelSet(names, values []string, extra, extraValue string) string {
	if len(names) == 0 && extra == "" {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(n + `="` + escapeValue(values[i]) + `"`)
	}
	if extra != "" {
		if len(names) > 0 {
			b.WriteByte(',')
		}
		b.WriteString(extra + `="` + extraValue + `"`)
	}
	b.WriteByte('}')
	return b.String()
}

var (
	valueEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
)

func escapeValue(s string) string { return valueEscaper.Replace(s) }
func escapeHelp(s string) string  { return helpEscaper.Replace(s) }

func fmtFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
