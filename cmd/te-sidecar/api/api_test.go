package api_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/tecache/te/cmd/te-sidecar/api"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type body struct {
	ID     string   `json:"id"`
	Blocks []int    `json:"blocks"`
	Reason string   `json:"reason,omitempty"`
	Inner  *inner   `json:"inner,omitempty"`
	Raw    rawField `json:"raw,omitempty"`
}

type inner struct {
	N uint64 `json:"n"`
}

type rawField = json.RawMessage

func ExampleDecode() {
	var v struct {
		Segment string `json:"segment"`
	}
	fmt.Println(api.Decode([]byte(`{"segmnt":"10.0.0.6:7000"}`), &v))
	fmt.Println(api.Decode([]byte(`{"segment":"10.0.0.6:7000"} {}`), &v))
	fmt.Println(api.Decode([]byte(`{"segment":7000}`), &v))
	fmt.Println(api.Decode([]byte(`{"segment":"10.0.0.6:7000"}`), &v), v.Segment)
	// Output:
	// unknown field "segmnt"
	// unexpected data after the JSON value
	// field "segment": a JSON number where a string is expected
	// <nil> 10.0.0.6:7000
}

func TestDecode(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{``, "empty body: a JSON value is expected"},
		{`{"id":`, "unexpected EOF"},
		{`[1]`, "the body: a JSON array where an object is expected"},
		{`{"inner":{"n":1,"m":2}}`, `unknown field "m"`},
		{`{"inner":{"n":-1}}`, `field "inner.n": a JSON number -1 where an integer is expected`},
		{`{"blocks":[1,"2"]}`, `field "blocks": a JSON string where an integer is expected`},
	} {
		var b body
		err := api.Decode([]byte(c.in), &b)
		if err == nil || (err.Error() != c.want && !strings.HasPrefix(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %s", c.in, err, c.want)
		}
	}
}

// TestDocument: a struct becomes a named schema that lists its fields,
// requires those without omitempty and refuses others; routes give their
// parameters, body, answer and refusals, the common ones included.
func TestDocument(t *testing.T) {
	routes := []api.Route{
		{Method: "POST", Path: "/x/y", Summary: "post", Body: reflect.TypeFor[body](), Answer: reflect.TypeFor[inner](),
			Headers: []api.Param{{Name: "X-H", Required: true}}, Refusals: []int{409}},
		{Method: "GET", Path: "/x/y", Summary: "get", Auth: api.Open, Query: []api.Param{{Name: "id", Required: true}, {Name: "n", Type: "integer"}}},
	}
	b, err := api.Document(api.Info{Title: "t", Version: "v", Raw: map[string]reflect.Type{"raw": reflect.TypeFor[inner]()}}, routes)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths      map[string]map[string]map[string]any
		Components struct{ Schemas map[string]map[string]any }
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	post := doc.Paths["/x/y"]["post"]
	if post["operationId"] != "postXY" || len(post["parameters"].([]any)) != 1 {
		t.Fatalf("post: %v", post)
	}
	resp := post["responses"].(map[string]any)
	for _, code := range []string{"200", "400", "401", "405", "409", "413", "503"} {
		if resp[code] == nil {
			t.Errorf("post lacks %s", code)
		}
	}
	get := doc.Paths["/x/y"]["get"]
	if r := get["responses"].(map[string]any); r["401"] != nil || r["413"] != nil {
		t.Errorf("an open route without a body answers 401 or 413: %v", r)
	}
	s := doc.Components.Schemas["body"]
	if fmt.Sprint(s["required"]) != "[blocks id]" || s["additionalProperties"] != false {
		t.Fatalf("body schema %v", s)
	}
	props := s["properties"].(map[string]any)
	if fmt.Sprint(props["raw"]) != "map[$ref:#/components/schemas/inner]" || fmt.Sprint(props["blocks"]) != "map[items:map[format:int64 type:integer] type:array]" {
		t.Fatalf("properties %v", props)
	}
	again, _ := api.Document(api.Info{Title: "t", Version: "v", Raw: map[string]reflect.Type{"raw": reflect.TypeFor[inner]()}}, routes)
	if string(again) != string(b) {
		t.Fatal("the same routes gave another document")
	}
}
