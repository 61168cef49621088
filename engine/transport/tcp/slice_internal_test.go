package tcp

import (
	"testing"

	"github.com/tecache/te/engine/segment"
)

// Requests to a peer's registered file are sliced no smaller than the
// owner's file I/O (te_file_chunk), at most maxFileSlice; memory buffers,
// files without the field or with a smaller or malformed one keep
// tcp.slice.
func TestSliceForFile(t *testing.T) {
	tr := &Transport{opt: Options{Slice: 512 << 10}}
	file := func(chunk string) *segment.BufferDesc {
		return &segment.BufferDesc{Name: segment.KindFile, Extra: map[string]string{segment.ExtraFileChunk: chunk}}
	}
	for name, c := range map[string]struct {
		b    *segment.BufferDesc
		want uint64
	}{
		"memory":          {&segment.BufferDesc{Name: "cpu:0", Extra: map[string]string{segment.ExtraFileChunk: "1048576"}}, 512 << 10},
		"no buffer":       {nil, 512 << 10},
		"file, 1 MiB I/O": {file("1048576"), 1 << 20},
		"file, smaller":   {file("65536"), 512 << 10},
		"file, huge":      {file("1073741824"), maxFileSlice},
		"file, malformed": {file("1MiB"), 512 << 10},
		"file, no field":  {&segment.BufferDesc{Name: segment.KindFile}, 512 << 10},
	} {
		if got := tr.sliceFor(c.b); got != c.want {
			t.Errorf("%s: slice %d, want %d", name, got, c.want)
		}
	}
}
