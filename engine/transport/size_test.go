package transport

import "testing"

func TestParseSize(t *testing.T) {
	for s, want := range map[string]uint64{"65536": 65536, "64KiB": 64 << 10, "64k": 64 << 10, "64 kb": 64 << 10,
		"1 MiB": 1 << 20, "2G": 2 << 30, "512B": 512, " 7 ": 7, "0": 0} {
		if got, err := ParseSize(s); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "KiB", "-1", "1.5M", "12TiB", "4 KiB x", "99999999999999999999G", "17179869184G"} {
		if n, err := ParseSize(s); err == nil {
			t.Errorf("ParseSize(%q) = %d, want an error", s, n)
		}
	}
}
