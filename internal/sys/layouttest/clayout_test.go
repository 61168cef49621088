package layouttest

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	m := Parse(t, []byte("# note\nstruct a.b 8 4\n\nX 0 17\n"))
	if m["struct a.b"] != [2]uint64{8, 4} || m["X"] != [2]uint64{0, 17} || len(m) != 2 {
		t.Fatalf("%v", m)
	}
}

func TestProgram(t *testing.T) {
	p := Program("linux/types.h", []Fact{Member("struct s", "m", 8, 4), Size("struct s", 16), Const("N", 3)})
	for _, want := range []string{"#include <linux/types.h>", "offsetof(struct s, m)", "sizeof(struct s)", "(size_t)(N)"} {
		if !strings.Contains(p, want) {
			t.Errorf("program lacks %q:\n%s", want, p)
		}
	}
}

func TestProgramSeveralHeaders(t *testing.T) {
	p := Program("rdma/fi_rma.h rdma/fi_cm.h", nil)
	for _, want := range []string{"#include <rdma/fi_rma.h>\n", "#include <rdma/fi_cm.h>\n"} {
		if !strings.Contains(p, want) {
			t.Errorf("program lacks %q:\n%s", want, p)
		}
	}
}

// TestProgramDefines: a NAME=VALUE in the header list is defined before the
// headers after it, in order.
func TestProgramDefines(t *testing.T) {
	p := Program("__HIP_PLATFORM_AMD__=1 hip/hip_runtime_api.h", nil)
	d := strings.Index(p, "#define __HIP_PLATFORM_AMD__ 1\n")
	i := strings.Index(p, "#include <hip/hip_runtime_api.h>\n")
	if d < 0 || i < 0 || d > i || strings.Contains(p, "<__HIP") {
		t.Fatalf("want the define before the include:\n%s", p)
	}
}
