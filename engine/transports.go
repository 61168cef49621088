package engine

// The transports an engine can install; each registers itself in init.
import (
	_ "github.com/tecache/te/engine/transport/cuda"
	_ "github.com/tecache/te/engine/transport/file"
	_ "github.com/tecache/te/engine/transport/local"
	_ "github.com/tecache/te/engine/transport/rdma"
	_ "github.com/tecache/te/engine/transport/shm"
	_ "github.com/tecache/te/engine/transport/tcp"
)
