package main

/*
#include "te.h"
typedef const char te_cchar;
typedef const te_config_t te_cconfig;
*/
import "C"

import (
	_ "github.com/tecache/te/engine/std"

	"encoding/json"
	"strings"
	"time"
	"unsafe"

	"github.com/tecache/te/capi/internal/glue"
	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// maxConfigSize bounds te_config_t.size: a larger value is a caller bug.
const maxConfigSize = 1 << 16

// readConfig copies the fields of cfg that lie within cfg.size.
func readConfig(cfg *C.te_cconfig) (glue.Config, error) {
	var c glue.Config
	if cfg == nil {
		return c, nil
	}
	size := uintptr(cfg.size)
	known := unsafe.Sizeof(C.te_config_t{})
	if size < unsafe.Sizeof(cfg.size) || size > maxConfigSize {
		return c, errs.New(errs.InvalidArgument, "create", "te_config_t.size is %d; initialise with TE_CONFIG_INIT", size)
	}
	if size > known {
		// A newer header's fields: refuse only if the caller set one.
		tail := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(cfg), known)), size-known)
		for _, b := range tail {
			if b != 0 {
				return c, errs.New(errs.NotSupported, "create",
					"te_config_t has %d bytes, this library knows %d and a field it does not know is set", size, known)
			}
		}
	}
	// Each field is read only when it lies within size: a caller built
	// against an older te.h has nothing beyond its struct's end.
	var z C.te_config_t
	base := unsafe.Pointer(cfg)
	has := func(off, n uintptr) bool { return off+n <= size }
	str := func(off uintptr) string {
		if !has(off, unsafe.Sizeof(z.params)) {
			return ""
		}
		return C.GoString(*(**C.char)(unsafe.Add(base, off)))
	}
	i32 := func(off uintptr) int32 {
		if !has(off, 4) {
			return 0
		}
		return *(*int32)(unsafe.Add(base, off))
	}
	i64 := func(off uintptr) int64 {
		if !has(off, 8) {
			return 0
		}
		return *(*int64)(unsafe.Add(base, off))
	}
	u64 := func(off uintptr) uint64 {
		if !has(off, 8) {
			return 0
		}
		return *(*uint64)(unsafe.Add(base, off))
	}
	c.LogLevel = int(i32(unsafe.Offsetof(z.log_level)))
	c.SegmentName = str(unsafe.Offsetof(z.segment_name))
	c.Metadata = str(unsafe.Offsetof(z.metadata))
	c.ListenAddr = str(unsafe.Offsetof(z.listen_addr))
	c.Hostname = str(unsafe.Offsetof(z.hostname))
	c.Transports = str(unsafe.Offsetof(z.transports))
	c.ForceTransport = str(unsafe.Offsetof(z.force_transport))
	c.Params = str(unsafe.Offsetof(z.params))
	c.TransferTimeoutMS = i64(unsafe.Offsetof(z.transfer_timeout_ms))
	c.RPCTimeoutMS = i64(unsafe.Offsetof(z.rpc_timeout_ms))
	c.MaxFrame = u64(unsafe.Offsetof(z.max_frame))
	c.MaxNotifies = i64(unsafe.Offsetof(z.max_notifies))
	// ABI 1.2
	c.AuthSecret = str(unsafe.Offsetof(z.auth_secret))
	c.AuthSecretFile = str(unsafe.Offsetof(z.auth_secret_file))
	c.AcceptMooncakePeers = i32(unsafe.Offsetof(z.accept_mooncake_peers)) != 0
	c.AllowMooncakeWithSecret = i32(unsafe.Offsetof(z.allow_mooncake_with_secret)) != 0
	c.UnregisterGraceMS = i64(unsafe.Offsetof(z.unregister_grace_ms))
	c.MaxConns = i32(unsafe.Offsetof(z.max_conns))
	c.MaxConnsPerHost = i32(unsafe.Offsetof(z.max_conns_per_host))
	c.IdleTimeoutMS = i64(unsafe.Offsetof(z.idle_timeout_ms))
	c.ProgressTimeoutMS = i64(unsafe.Offsetof(z.progress_timeout_ms))
	c.NotifyBytes = u64(unsafe.Offsetof(z.notify_bytes))
	c.NotifyBytesPerSender = u64(unsafe.Offsetof(z.notify_bytes_per_sender))
	// ABI 1.3
	c.Encrypt = i32(unsafe.Offsetof(z.encrypt)) != 0
	return c, nil
}

//export tego_local_topology
func tego_local_topology(devices *C.te_cchar, buf *C.char, n C.size_t) (rc C.int) {
	defer enter("local topology", &rc)()
	var filter []string
	for _, d := range strings.Split(cstr(devices), ",") {
		if d = strings.TrimSpace(d); d != "" {
			filter = append(filter, d)
		}
	}
	b, err := json.Marshal(glue.LocalTopology(glue.SysRoot, filter))
	if err != nil {
		return fail(errs.Wrap(errs.Internal, "local topology", err, "encoding"))
	}
	return putString("local topology", buf, n, string(b))
}

//export tego_create
func tego_create(cfg *C.te_cconfig, out *C.te_engine_t) (rc C.int) {
	defer enter("create", &rc)()
	if out == nil {
		return null("create", "out")
	}
	*out = 0
	syncEnv() // the engine reads TE_* as the host has them now (ops.go)
	c, err := readConfig(cfg)
	if err != nil {
		return fail(err)
	}
	ec, err := c.EngineConfig()
	if err != nil {
		return fail(err)
	}
	e, err := engine.New(ec)
	if err != nil {
		return fail(err)
	}
	*out = C.te_engine_t(engines.Put(0, e))
	return 0
}

//export tego_destroy
func tego_destroy(h C.te_engine_t) (rc C.int) {
	defer enter("destroy", &rc)()
	e, err := engines.Delete("destroy", uint64(h))
	if err != nil {
		return fail(err)
	}
	dropHandoffs(uint64(h)) // before Close: aborts need the engine
	segments.DropOwner(uint64(h))
	bs := batches.DropOwner(uint64(h))
	err = e.Close()
	// Close has ended every task, so each batch frees (closing its
	// eventfd). One can still be busy for a moment: a te_submit another
	// thread began before the handle went is handing its tasks to the
	// closed transports, which end them at once.
	for _, be := range bs {
		if ferr := freeClosed(be.b); ferr != nil && err == nil {
			err = ferr
		}
	}
	return fail(err)
}

// destroyWait bounds how long te_destroy waits for a batch of the closed
// engine to become free: its tasks end as soon as they reach a closed
// transport, so only a submit stuck in validation can take this long.
const destroyWait = 10 * time.Second

// freeClosed frees a batch of a closed engine, waiting while it is busy.
// The eventfd is closed only by a Free that succeeds: a batch that may
// still settle would signal an fd number the application may have reused.
func freeClosed(b *engine.Batch) error {
	deadline := time.Now().Add(destroyWait)
	for {
		err := b.Free()
		if errs.CodeOf(err) != errs.BatchBusy {
			if errs.CodeOf(err) == errs.InvalidArgument {
				return nil // freed already (te_free_batch raced te_destroy)
			}
			return err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return errs.Wrap(errs.BatchBusy, "destroy", err, "a batch of the engine could not be freed within %v; "+
				"its memory and eventfd stay allocated", destroyWait)
		}
		select {
		case <-b.Done():
			time.Sleep(time.Millisecond) // settled; a submit may still be handing off
		case <-time.After(min(left, 10*time.Millisecond)):
		}
	}
}

func getEngine(op string, h C.te_engine_t) (*engine.Engine, error) {
	e, _, err := engines.Get(op, uint64(h))
	return e, err
}

//export tego_segment_name
func tego_segment_name(h C.te_engine_t, buf *C.char, n C.size_t) (rc C.int) {
	defer enter("segment name", &rc)()
	e, err := getEngine("segment name", h)
	if err != nil {
		return fail(err)
	}
	return putString("segment name", buf, n, e.Name())
}

//export tego_rpc_port
func tego_rpc_port(h C.te_engine_t, port *C.int32_t) (rc C.int) {
	defer enter("rpc port", &rc)()
	e, err := getEngine("rpc port", h)
	if err != nil {
		return fail(err)
	}
	if port == nil {
		return null("rpc port", "port")
	}
	*port = C.int32_t(e.RPCPort())
	return 0
}

//export tego_cxl_memory
func tego_cxl_memory(h C.te_engine_t, addr, size *C.uint64_t) (rc C.int) {
	defer enter("cxl memory", &rc)()
	e, err := getEngine("cxl memory", h)
	if err != nil {
		return fail(err)
	}
	if addr == nil || size == nil {
		return null("cxl memory", "addr or size")
	}
	a, n, err := e.CXLMemory()
	if err != nil {
		return fail(err)
	}
	*addr, *size = C.uint64_t(a), C.uint64_t(n)
	return 0
}

//export tego_stats
func tego_stats(h C.te_engine_t, out *C.te_stats_t) (rc C.int) {
	defer enter("stats", &rc)()
	e, err := getEngine("stats", h)
	if err != nil {
		return fail(err)
	}
	if out == nil {
		return null("stats", "out")
	}
	size := uintptr(out.size)
	if size < unsafe.Sizeof(out.size) {
		return fail(errs.New(errs.InvalidArgument, "stats", "te_stats_t.size is %d; set it to sizeof(te_stats_t)", size))
	}
	s := e.Stats()
	var z C.te_stats_t
	put := func(off uintptr, dst *C.uint64_t, v uint64) {
		if off+8 <= size {
			*dst = C.uint64_t(v)
		}
	}
	if unsafe.Offsetof(z.buffers)+4 <= size {
		out.buffers = C.uint32_t(s.Buffers)
	}
	put(unsafe.Offsetof(z.tasks_completed), &out.tasks_completed, s.TasksCompleted)
	put(unsafe.Offsetof(z.tasks_failed), &out.tasks_failed, s.TasksFailed)
	put(unsafe.Offsetof(z.tasks_timed_out), &out.tasks_timed_out, s.TasksTimedOut)
	put(unsafe.Offsetof(z.bytes_transferred), &out.bytes_transferred, s.BytesTransferred)
	put(unsafe.Offsetof(z.notifies_sent), &out.notifies_sent, s.NotifiesSent)
	put(unsafe.Offsetof(z.notifies_received), &out.notifies_received, s.NotifiesReceived)
	return 0
}

//export tego_stats_json
func tego_stats_json(h C.te_engine_t, buf *C.char, n C.size_t) (rc C.int) {
	defer enter("stats json", &rc)()
	e, err := getEngine("stats json", h)
	if err != nil {
		return fail(err)
	}
	b, err := json.Marshal(e.Stats())
	if err != nil {
		return fail(errs.Wrap(errs.Internal, "stats json", err, "encoding"))
	}
	return putString("stats json", buf, n, string(b))
}
