package api

import (
	"encoding"
	"encoding/json"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// Info is what Document needs beside the routes.
type Info struct {
	Title, Version, Description string
	// Error is the Go type of every refusal's JSON body.
	Error reflect.Type
	// Enums lists the values of string types (e.g. a state).
	Enums map[reflect.Type][]string
	// Raw gives the type documented for a json.RawMessage field, by the
	// field's JSON name (e.g. "layout": kvcache.Layout).
	Raw map[string]reflect.Type
	// Fields describes fields, keyed "Type.json_name".
	Fields map[string]string
}

// Document returns the OpenAPI 3.0 document of routes, as indented JSON
// with sorted keys: the same routes give the same bytes.
func Document(info Info, routes []Route) ([]byte, error) {
	g := &gen{info: info, comps: map[string]any{}}
	paths := map[string]map[string]any{}
	for _, r := range routes {
		p := paths[r.Path]
		if p == nil {
			p = map[string]any{}
			paths[r.Path] = p
		}
		p[strings.ToLower(r.Method)] = g.operation(r)
	}
	doc := map[string]any{
		"openapi": "3.0.3",
		"info":    map[string]any{"title": info.Title, "version": info.Version, "description": info.Description},
		"paths":   paths,
		"components": map[string]any{
			"schemas": g.comps,
			"securitySchemes": map[string]any{
				"bearer": map[string]any{"type": "http", "scheme": "bearer", "description": "With a cluster secret: " +
					"lowercase hex of HMAC-SHA256(secret, \"te-sidecar-token v1\"), or a client's own token, " +
					"hex of HMAC-SHA256(secret, \"te-sidecar-client v1\\n\" + name) with the name in X-Te-Client. " +
					"On /metadata the metadata token (MC_METADATA_HTTP_TOKEN) too."},
			},
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

type gen struct {
	info  Info
	comps map[string]any
}

func (g *gen) operation(r Route) map[string]any {
	op := map[string]any{
		"operationId": operationID(r.Method, r.Path),
		"summary":     r.Summary,
	}
	if r.Description != "" {
		op["description"] = r.Description
	}
	if r.Tag != "" {
		op["tags"] = []string{r.Tag}
	}
	switch r.Auth {
	case Open:
		op["security"] = []any{}
	default:
		op["security"] = []any{map[string]any{"bearer": []string{}}}
	}
	var params []any
	for _, p := range r.Query {
		params = append(params, param("query", p))
	}
	for _, p := range r.Headers {
		params = append(params, param("header", p))
	}
	if len(params) > 0 {
		op["parameters"] = params
	}
	switch {
	case r.RawBody != "":
		op["requestBody"] = map[string]any{"required": true, "content": map[string]any{r.RawBody: map[string]any{"schema": map[string]any{}}}}
	case r.Body != nil:
		op["requestBody"] = map[string]any{"required": true,
			"content": map[string]any{"application/json": map[string]any{"schema": g.schema(r.Body, "")}}}
	}
	ok := map[string]any{"description": "OK"}
	switch {
	case r.AnswerType != "":
		ok["content"] = map[string]any{r.AnswerType: map[string]any{"schema": map[string]any{"type": "string"}}}
	case r.Answer != nil:
		ok["content"] = map[string]any{"application/json": map[string]any{"schema": g.schema(r.Answer, "")}}
	}
	responses := map[string]any{"200": ok}
	codes := slices.Clone(Common)
	if r.Auth == Open {
		codes = slices.DeleteFunc(codes, func(c int) bool { return c == 401 })
	}
	if r.Body == nil && r.RawBody == "" {
		codes = slices.DeleteFunc(codes, func(c int) bool { return c == 413 })
	}
	codes = append(codes, r.Refusals...)
	slices.Sort(codes)
	for _, c := range slices.Compact(codes) {
		resp := map[string]any{"description": http.StatusText(c)}
		if g.info.Error != nil {
			resp["content"] = map[string]any{"application/json": map[string]any{"schema": g.schema(g.info.Error, "")}}
		}
		responses[strconv.Itoa(c)] = resp
	}
	op["responses"] = responses
	return op
}

func param(in string, p Param) map[string]any {
	t := p.Type
	if t == "" {
		t = "string"
	}
	s := map[string]any{"type": t}
	if len(p.Enum) > 0 {
		s["enum"] = p.Enum
	}
	if t == "integer" {
		s["minimum"] = 0
	}
	m := map[string]any{"name": p.Name, "in": in, "schema": s, "required": p.Required}
	if p.Description != "" {
		m["description"] = p.Description
	}
	return m
}

// operationID is e.g. postHandoffExpect for POST /handoff/expect.
func operationID(method, path string) string {
	var b strings.Builder
	b.WriteString(strings.ToLower(method))
	for _, part := range strings.FieldsFunc(path, func(r rune) bool { return r == '/' || r == '.' || r == '_' || r == '-' }) {
		b.WriteString(strings.ToUpper(part[:1]) + part[1:])
	}
	return b.String()
}

var (
	rawType  = reflect.TypeFor[json.RawMessage]()
	textType = reflect.TypeFor[encoding.TextMarshaler]()
)

// schema returns the schema of t; field is the JSON name of the field
// that has it (for Raw).
func (g *gen) schema(t reflect.Type, field string) map[string]any {
	return schemaOf(t, g, []string{field})
}

// schemaOf is schema with g optional (nil: inline structs, no names).
func schemaOf(t reflect.Type, g *gen, field []string) map[string]any {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	fname := ""
	if len(field) > 0 {
		fname = field[0]
	}
	if t == rawType {
		if g != nil {
			if rt, ok := g.info.Raw[fname]; ok {
				return schemaOf(rt, g, nil)
			}
		}
		return map[string]any{}
	}
	if g != nil {
		if vals, ok := g.info.Enums[t]; ok {
			return map[string]any{"type": "string", "enum": vals}
		}
	}
	if t.Implements(textType) || reflect.PointerTo(t).Implements(textType) {
		return map[string]any{"type": "string"}
	}
	switch t.Kind() {
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int8, reflect.Int16, reflect.Int32:
		return map[string]any{"type": "integer", "format": "int32"}
	case reflect.Int, reflect.Int64:
		return map[string]any{"type": "integer", "format": "int64"}
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return map[string]any{"type": "integer", "format": "int32", "minimum": 0}
	case reflect.Uint, reflect.Uint64, reflect.Uintptr:
		return map[string]any{"type": "integer", "format": "int64", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice, reflect.Array:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem(), g, nil)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem(), g, nil)}
	case reflect.Struct:
		if g == nil {
			return map[string]any{"type": "object"}
		}
		name := t.Name()
		if _, ok := g.comps[name]; !ok {
			g.comps[name] = map[string]any{} // a placeholder, for recursive types
			g.comps[name] = g.object(t)
		}
		return map[string]any{"$ref": "#/components/schemas/" + name}
	}
	return map[string]any{}
}

// object is the schema of a struct: its JSON fields; those without
// omitempty are required. Decode refuses other fields, and so does the
// schema.
func (g *gen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	for f := range t.Fields() {
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		s := schemaOf(f.Type, g, []string{name})
		if d, ok := g.info.Fields[t.Name()+"."+name]; ok {
			if _, ref := s["$ref"]; ref {
				// OpenAPI 3.0 ignores siblings of $ref: wrap it.
				s = map[string]any{"allOf": []any{s}}
			}
			s["description"] = d
		}
		props[name] = s
		if !strings.Contains(opts, "omitempty") {
			required = append(required, name)
		}
	}
	o := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		slices.Sort(required)
		o["required"] = required
	}
	return o
}
