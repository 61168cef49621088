package main

/*
#include "te.h"
*/
import "C"

import (
	"bytes"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

//export tego_version
func tego_version(buf *C.char, n C.size_t) (rc C.int) {
	defer enter("version", &rc)()
	return putString("version", buf, n, engine.Version)
}

//export tego_metrics
func tego_metrics(h C.te_engine_t, buf *C.char, n C.size_t, needed *C.size_t) (rc C.int) {
	defer enter("metrics", &rc)()
	e, err := getEngine("metrics", h)
	if err != nil {
		return fail(err)
	}
	if buf == nil && (n != 0 || needed == nil) {
		return null("metrics", "buf")
	}
	var b bytes.Buffer
	if err := e.WriteMetrics(&b); err != nil {
		return fail(errs.Wrap(errs.Internal, "metrics", err, "writing"))
	}
	if needed != nil {
		*needed = C.size_t(b.Len() + 1)
	}
	if buf == nil {
		return fail(errs.New(errs.BufferTooSmall, "metrics", "%d bytes needed, no buffer given", b.Len()+1))
	}
	return putString("metrics", buf, n, b.String())
}
