package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/valyala/fasthttp"
)

// Auth says what a route needs from its caller.
type Auth int

// Auth levels. The zero value is the strictest.
const (
	// Token: with a cluster secret, its token or a client token.
	Token Auth = iota
	// Metadata: Token, or the metadata token (Mooncake's
	// MC_METADATA_HTTP_TOKEN) when one is set.
	Metadata
	// Open: anyone (probes and scrapers hold no secret).
	Open
)

// Param is a query parameter.
type Param struct {
	Name        string
	Description string
	// Type is the OpenAPI type: "string" (default), "integer" or "boolean".
	Type     string
	Enum     []string
	Required bool
}

// Route is one method on one path.
type Route struct {
	Method, Path string
	Summary      string
	Description  string
	Tag          string
	Auth         Auth
	Query        []Param
	// Headers are the request headers the route reads (documentation
	// only: the server does not refuse others).
	Headers []Param
	// Body is the Go type of the JSON request body (nil: none).
	Body reflect.Type
	// RawBody, when not empty, documents a body taken as it is (of this
	// media type) instead of a JSON object of type Body.
	RawBody string
	// Answer is the Go type of the JSON answer on success (nil: see
	// AnswerType).
	Answer reflect.Type
	// AnswerType is the media type of a success answer that is not a JSON
	// object of type Answer (e.g. the Prometheus text format).
	AnswerType string
	// Refusals are the statuses the route itself may answer besides 200;
	// every route may also answer those the server adds (Common).
	Refusals []int
	Handler  fasthttp.RequestHandler
}

// Common are the refusals the server may answer on any route before its
// handler: 400 (an undeclared query parameter, an unreadable request), 401
// (no token, on a route that needs one), 405, 413 (a body over its limit),
// 503 (shutting down, or bodies in flight at their bound).
var Common = []int{400, 401, 405, 413, 503}

// Declares reports whether name is a declared query parameter of r.
func (r *Route) Declares(name string) bool {
	for _, p := range r.Query {
		if p.Name == name {
			return true
		}
	}
	return false
}

// Decode decodes body, one JSON value, into v strictly: a field v does not
// have is refused by name (`unknown field "segmnt"`), and so is anything
// after the value. The message names the problem without Go's package
// prefix.
func Decode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return clean(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

func clean(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "the body"
		} else {
			field = "field " + fmt.Sprintf("%q", field)
		}
		return fmt.Errorf("%s: a JSON %s where %s is expected", field, te.Value, jsonKind(te.Type))
	}
	if errors.Is(err, io.EOF) {
		return errors.New("empty body: a JSON value is expected")
	}
	return errors.New(strings.TrimPrefix(err.Error(), "json: "))
}

// jsonKind names what a Go type is in JSON.
func jsonKind(t reflect.Type) string {
	s := schemaOf(t, nil, nil)
	if ty, ok := s["type"].(string); ok {
		switch ty {
		case "integer":
			return "an integer"
		case "array":
			return "an array"
		case "object":
			return "an object"
		}
		return "a " + ty
	}
	return "a value"
}
