package sidecar

import (
	"bytes"
	"encoding/json"

	"github.com/valyala/fasthttp"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache/handoff/proto"
)

// Every refusal of the sidecar, on every route, is a JSON proto.ErrorBody:
// {"instance": ..., "error": "...", "code": <errs code>}, with the
// transfer's record on a handoff conflict.

// errorJSON is the body of a refusal.
func errorJSON(instance, msg string, code errs.Code, rec *proto.Record) []byte {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "<token>" reads as it is written
	enc.Encode(proto.ErrorBody{Instance: instance, Error: msg, Code: int32(code), Record: rec})
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// refuse answers status with a JSON error body.
func (s *Server) refuse(ctx *fasthttp.RequestCtx, status int, code errs.Code, msg string) {
	ctx.Response.ResetBody()
	ctx.SetStatusCode(status)
	ctx.Response.Header.Set(proto.InstanceHeader, s.instance)
	ctx.SetContentType("application/json")
	ctx.SetBody(errorJSON(s.instance, msg, code, nil))
}

// codeOf is the errs code of a refusal status the sidecar answers itself.
func codeOf(status int) errs.Code {
	switch status {
	case fasthttp.StatusUnauthorized:
		return errs.Unauthenticated
	case fasthttp.StatusNotFound:
		return errs.NotFound
	case fasthttp.StatusRequestEntityTooLarge, fasthttp.StatusTooManyRequests, fasthttp.StatusServiceUnavailable,
		fasthttp.StatusInsufficientStorage, fasthttp.StatusRequestHeaderFieldsTooLarge:
		return errs.ResourceExhausted
	case fasthttp.StatusRequestTimeout:
		return errs.Timeout
	}
	return errs.InvalidArgument
}
