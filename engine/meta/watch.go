package meta

import "context"

// Watcher is implemented by stores that push changes (etcd). An engine whose
// store is a Watcher watches the descriptors of the segments it has open and
// refetches one as soon as it changed or disappeared, instead of waiting for a
// transfer to fail.
type Watcher interface {
	// Watch calls fn with the key of every change (put or delete) under
	// prefix until ctx ends. After a reconnection, when changes may have
	// been missed, it calls fn(prefix): treat every key as changed. Watch
	// returns once the watch is set up; fn runs on the store's goroutine
	// and must not block.
	Watch(ctx context.Context, prefix string, fn func(key string)) error
}
