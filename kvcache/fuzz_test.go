package kvcache_test

import (
	"encoding/json"
	"testing"

	"github.com/tecache/te/kvcache"
)

// FuzzLayout decodes arbitrary JSON as a layout, as a peer's description
// arrives: decoding, Validate, Addr and planning the layout onto itself must
// never panic, and a layout that validates must plan.
func FuzzLayout(f *testing.F) {
	f.Add([]byte(`{"format":"vllm","order":"HND","dtype":"bf16","num_blocks":4,"block_size":16,"num_heads":8,"head_dim":128,"bases":[4096,1048576]}`))
	f.Add([]byte(`{"format":"sglang","dtype":"fp8","num_blocks":2,"block_size":1,"num_heads":1,"head_dim":1,"k_bases":[1],"v_bases":[3]}`))
	f.Add([]byte(`{"format":"mla","dtype":"fp32","num_blocks":9,"block_size":64,"head_dim":576,"first_layer":3,"bases":[65536]}`))
	f.Add([]byte(`{"format":"flashinfer","dtype":"fp16","num_blocks":1,"block_size":2147483647,"num_heads":2147483647,"head_dim":2147483647,"bases":[1]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var l kvcache.Layout
		if json.Unmarshal(b, &l) != nil {
			return
		}
		_, _ = l.Addr(l.FirstLayer, 0, 0, 0, l.HeadStart)
		_, _ = l.LayerBytes()
		if l.Validate() != nil {
			return
		}
		p, err := kvcache.NewPlan(&l, &l, []int{0}, []int{0}, kvcache.Layers(l.FirstLayer, l.FirstLayer+1))
		if err != nil {
			t.Fatalf("valid layout %+v does not plan: %v", l, err)
		}
		if len(p.Transfers()) == 0 {
			t.Fatal("empty plan")
		}
		a, err := l.Addr(l.FirstLayer, 0, 0, 0, l.HeadStart)
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range p.Transfers() {
			if x.Src == a {
				return
			}
		}
		t.Fatalf("no transfer starts at K of block 0, %#x: %+v", a, p.Transfers())
	})
}
