package promcheck

import (
	"strings"
	"testing"
)

// TestCheck: the checker finds what promtool would, and passes good text.
func TestCheck(t *testing.T) {
	good := "# HELP te_x_total Things.\n# TYPE te_x_total counter\nte_x_total{a=\"b\"} 3\n" +
		"# HELP te_wait_seconds Durations.\n# TYPE te_wait_seconds histogram\n" +
		"te_wait_seconds_bucket{le=\"0.1\"} 1\nte_wait_seconds_bucket{le=\"+Inf\"} 2\nte_wait_seconds_sum 0.3\nte_wait_seconds_count 2\n"
	if p := Check([]byte(good)); len(p) != 0 {
		t.Fatalf("good text: %v", p)
	}
	for name, bad := range map[string]string{
		"counter without _total": "# HELP te_x Things.\n# TYPE te_x counter\nte_x 3\n",
		"no HELP":                "# TYPE te_y gauge\nte_y 1\n",
		"camelCase":              "# HELP te_fooBar X.\n# TYPE te_fooBar gauge\nte_fooBar 1\n",
		"milliseconds":           "# HELP te_t_milliseconds X.\n# TYPE te_t_milliseconds gauge\nte_t_milliseconds 1\n",
		"not the format":         "te x y z\n",
	} {
		if p := Check([]byte(bad)); len(p) == 0 {
			t.Errorf("%s: no problem found in %q", name, bad)
		} else {
			t.Logf("%s: %s", name, strings.Join(p, "; "))
		}
	}
}
