package main

/*
#include "te.h"

extern char **environ;
static char **tecapi_environ(void) { return environ; }
*/
import "C"

import (
	"bytes"
	"os"
	"strings"
	"unsafe"

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

// envPrefixes name the variables te reads (README.md, "Environment").
var envPrefixes = []string{"TE_", "MC_"}

func teVar(name string) bool {
	for _, p := range envPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// syncEnv makes the Go runtime's copy of te's variables agree with the C
// environment. Go copied the environment the process started with when the
// library loaded; a host that set a variable since (Python's os.environ,
// setenv) expects te_create to see it. Only te's variables are looked at,
// and only those that differ are written.
func syncEnv() {
	cur := map[string]string{}
	if p := C.tecapi_environ(); p != nil {
		envp := unsafe.Slice(p, 1<<20)
		for i := 0; i < len(envp) && envp[i] != nil; i++ {
			kv := C.GoString(envp[i])
			if k, v, ok := strings.Cut(kv, "="); ok && teVar(k) {
				cur[k] = v
			}
		}
	}
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); teVar(k) {
			if _, ok := cur[k]; !ok {
				os.Unsetenv(k)
			}
		}
	}
	for k, v := range cur {
		if old, ok := os.LookupEnv(k); !ok || old != v {
			os.Setenv(k, v)
		}
	}
}
