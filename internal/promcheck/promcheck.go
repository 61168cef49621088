package promcheck

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

// Check returns every problem found in text: parse errors, promlint's
// findings (naming conventions, units, counters ending in _total), and
// families without a HELP or TYPE line.
func Check(text []byte) []string {
	var out []string
	problems, err := promlint.New(bytes.NewReader(text)).Lint()
	if err != nil {
		return []string{"parse: " + err.Error()}
	}
	for _, p := range problems {
		out = append(out, fmt.Sprintf("%s: %s", p.Metric, p.Text))
	}
	help, typ, seen := map[string]bool{}, map[string]bool{}, map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "# HELP "):
			f := strings.Fields(line)
			if len(f) < 4 {
				out = append(out, "empty HELP: "+line)
			} else {
				help[f[2]] = true
			}
		case strings.HasPrefix(line, "# TYPE "):
			if f := strings.Fields(line); len(f) >= 4 {
				typ[f[2]] = true
			}
		case line == "" || strings.HasPrefix(line, "#"):
		default:
			name := line
			if i := strings.IndexAny(name, "{ "); i >= 0 {
				name = name[:i]
			}
			seen[family(name, typ)] = true
		}
	}
	for f := range seen {
		if !help[f] || !typ[f] {
			out = append(out, "family "+f+" lacks a HELP or TYPE line")
		}
	}
	return out
}

// family maps a histogram's or summary's sample name to its family.
func family(name string, typ map[string]bool) string {
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && typ[base] {
			return base
		}
	}
	return name
}
