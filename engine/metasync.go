package engine

import (
	"context"
	"strings"

	"github.com/tecache/te/engine/meta"
)

// startMetaSync makes a watching store (etcd) invalidate cached descriptors
// as soon as a peer republishes or its segment disappears (an expired lease),
// so a transfer never starts from a descriptor the store no longer holds. It
// is called once by New after the first publication; the watch ends with the
// engine.
func (e *Engine) startMetaSync() {
	w, ok := e.store.(meta.Watcher)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	prefix := meta.KeyRAM("")
	if err := w.Watch(ctx, prefix, func(key string) { e.metaChanged(prefix, key) }); err != nil {
		cancel()
		e.cfg.Logger.Warn("te: watching the metadata store", "err", err)
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		<-e.done
		cancel()
	}()
}

// metaChanged marks the cached descriptor of the segment behind key stale;
// key == prefix means every one.
func (e *Engine) metaChanged(prefix, key string) {
	name, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return
	}
	e.segMu.Lock()
	defer e.segMu.Unlock()
	if name != "" {
		if st := e.segs[name]; st != nil && !st.local {
			st.stale.Store(true)
		}
		return
	}
	for _, st := range e.segs {
		if !st.local {
			st.stale.Store(true)
		}
	}
}
