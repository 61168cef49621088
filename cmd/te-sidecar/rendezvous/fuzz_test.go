package rendezvous_test

import (
	"github.com/tecache/te/kvcache/handoff/proto"

	"encoding/json"
	"testing"
	"time"

	"github.com/tecache/te/cmd/te-sidecar/rendezvous"
)

// FuzzTable feeds arbitrary JSON bodies to every operation of a table: no
// panic, and every answer is a record or a refusal with a 4xx/5xx status.
func FuzzTable(f *testing.F) {
	l := `{"format":"vllm","order":"NHD","dtype":"bf16","num_blocks":4,"block_size":16,"num_heads":2,"head_dim":64,"bases":[4096]}`
	for _, s := range []string{
		`{"id":"a","segment":"s","layout":` + l + `,"blocks":[1,2],"mode":"push"}`,
		`{"id":"a","segment":"s","layout":` + l + `,"blocks":[3,0]}`,
		`{"id":"a","ok":true,"bytes":5}`,
		`{"id":"a","role":"decode","reason":"x"}`,
		`{"id":"a","segment":"s","layout":{"format":"mla","dtype":"fp8","num_blocks":1e9,"block_size":-1},"blocks":[0]}`,
		`{"id":"","layout":null,"blocks":null,"timeout_ms":-5}`,
		`[]`, `null`, `{"blocks":[1e30]}`,
	} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, body []byte, op uint8) {
		tb := rendezvous.NewTable(rendezvous.Config{DefaultTimeout: time.Minute}, nil)
		defer tb.Close()
		for i := range 4 {
			var rec proto.Record
			var err *rendezvous.Refusal
			switch (int(op) + i) % 5 {
			case 0, 1:
				var d proto.Decl
				if json.Unmarshal(body, &d) != nil {
					continue
				}
				role := proto.Decode
				if (int(op)+i)%5 == 1 {
					role = proto.Prefill
				}
				rec, err = tb.Declare(role, d, "fuzz")
			case 2:
				var c proto.Complete
				if json.Unmarshal(body, &c) != nil {
					continue
				}
				rec, err = tb.Complete(c, string(body[:min(len(body), 32)]))
			case 3:
				var a proto.Abort
				if json.Unmarshal(body, &a) != nil {
					continue
				}
				rec, err = tb.Abort(a, a.Reason)
			case 4:
				var a proto.Abort
				if json.Unmarshal(body, &a) != nil {
					continue
				}
				rec, err = tb.Status(a.ID, a.Reason, a.Role)
			}
			switch {
			case err == nil && (rec.Instance != tb.Instance() || rec.State == ""):
				t.Fatalf("bad record %+v", rec)
			case err != nil && (err.Status < 400 || err.Status > 599 || err.Msg == ""):
				t.Fatalf("bad refusal %+v", err)
			}
		}
	})
}
