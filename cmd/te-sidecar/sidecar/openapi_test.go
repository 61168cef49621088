package sidecar_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/tecache/te/cmd/te-sidecar/sidecar"
)

var update = flag.Bool("update", false, "rewrite docs/te-sidecar.openapi.json from the route table")

// docPath is the OpenAPI document kept in the repository.
var docPath = filepath.Join("..", "..", "..", "docs", "te-sidecar.openapi.json")

// TestOpenAPI: GET /openapi.json is a valid OpenAPI 3 document (checked by
// kin-openapi), equal to docs/te-sidecar.openapi.json (go test -run
// TestOpenAPI -update rewrites it), that lists every route the server
// serves and nothing else. What it says is what is served: every query
// parameter it declares is taken and any other is refused by name, and
// every body field its schemas list is taken and any other is refused by
// name.
func TestOpenAPI(t *testing.T) {
	srv, base := serve(t, sidecar.Config{Version: "dev"})
	code, body, h := do(t, "GET", base+"/openapi.json", nil)
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
		t.Fatalf("GET /openapi.json: %d %s", code, h.Get("Content-Type"))
	}
	if *update {
		if err := os.WriteFile(docPath, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kept, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatalf("%v (go test -run TestOpenAPI -update writes it)", err)
	}
	if string(kept) != body {
		t.Fatalf("%s differs from the route table's document: run go test ./cmd/te-sidecar/sidecar -run TestOpenAPI -update", docPath)
	}
	doc, err := openapi3.NewLoader().LoadFromData([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("invalid OpenAPI document: %v", err)
	}
	// The same routes, both ways.
	served := map[string]bool{}
	for _, r := range srv.Routes() {
		served[r.Method+" "+r.Path] = true
		op := doc.Paths.Find(r.Path)
		if op == nil || op.GetOperation(r.Method) == nil {
			t.Errorf("%s %s is served but not documented", r.Method, r.Path)
		}
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !served[method+" "+path] {
				t.Errorf("%s %s is documented but not served", method, path)
			}
		}
	}
	for _, want := range []string{"GET /handoff/status", "GET /handoff/wait", "POST /handoff/expect", "POST /handoff/ready",
		"POST /handoff/complete", "POST /handoff/abort", "GET /metadata", "PUT /metadata", "DELETE /metadata",
		"GET /healthz", "GET /metrics", "GET /openapi.json"} {
		if !served[want] {
			t.Errorf("%s is not served", want)
		}
	}
	wait := doc.Paths.Find("/handoff/wait").Get
	var names []string
	for _, p := range wait.Parameters {
		names = append(names, p.Value.In+":"+p.Value.Name)
	}
	if !slices.Equal(names, []string{"query:id", "query:since", "query:timeout_ms", "query:role", "header:X-Te-Capability"}) {
		t.Errorf("GET /handoff/wait parameters %v", names)
	}

	// Behaviour: parameters.
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			if method != "GET" {
				continue
			}
			q := []string{}
			for _, p := range op.Parameters {
				if p.Value.In != "query" {
					continue
				}
				v := "x"
				if p.Value.Schema.Value.Type.Is("integer") {
					v = "1"
				}
				if len(p.Value.Schema.Value.Enum) > 0 {
					v = fmt.Sprint(p.Value.Schema.Value.Enum[0])
				}
				q = append(q, p.Value.Name+"="+v)
			}
			url := base + path + "?" + strings.Join(q, "&")
			if c, b, _ := do(t, "GET", url, nil); c == 400 && strings.Contains(b, "unknown query parameter") {
				t.Errorf("GET %s refuses its documented parameters: %s", url, b)
			}
			c, b, _ := do(t, "GET", base+path+"?zzz=1", nil)
			if c != 400 || !strings.Contains(b, `unknown query parameter \"zzz\"`) {
				t.Errorf("GET %s?zzz=1: %d %s", path, c, b)
			}
		}
	}
	// Behaviour: bodies. A body with every field of the schema gets past
	// decoding (whatever its values make of it); an extra field does not.
	for path, item := range doc.Paths.Map() {
		op := item.Post
		if op == nil {
			continue
		}
		schema := op.RequestBody.Value.Content.Get("application/json").Schema.Value
		full := map[string]any{}
		for name, p := range schema.Properties {
			full[name] = zero(p.Value)
		}
		b, _ := json.Marshal(full)
		if c, ans, _ := do(t, "POST", base+path, b); c == 400 && strings.Contains(ans, "unknown field") {
			t.Errorf("POST %s refuses a documented field: %s (body %s)", path, ans, b)
		}
		full["zzz"] = 1
		b, _ = json.Marshal(full)
		c, ans, _ := do(t, "POST", base+path, b)
		if c != 400 || !strings.Contains(ans, `unknown field \"zzz\"`) {
			t.Errorf("POST %s with an extra field: %d %s", path, c, ans)
		}
	}
}

// zero is a value of schema s's type.
func zero(s *openapi3.Schema) any {
	switch {
	case s.Type.Is("string"):
		if len(s.Enum) > 0 {
			return s.Enum[0]
		}
		return "x"
	case s.Type.Is("integer"), s.Type.Is("number"):
		return 1
	case s.Type.Is("boolean"):
		return true
	case s.Type.Is("array"):
		return []any{zero(s.Items.Value)}
	case s.Type.Is("object"):
		m := map[string]any{}
		for name, p := range s.Properties {
			m[name] = zero(p.Value)
		}
		return m
	}
	return nil
}
