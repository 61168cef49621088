package std

// The transports: each registers itself with package transport in init.
import (
	_ "github.com/tecache/te/engine/transport/cudaipc"
	_ "github.com/tecache/te/engine/transport/cxl"
	_ "github.com/tecache/te/engine/transport/fabric"
	_ "github.com/tecache/te/engine/transport/file"
	_ "github.com/tecache/te/engine/transport/local"
	_ "github.com/tecache/te/engine/transport/rdma"
	_ "github.com/tecache/te/engine/transport/shm"
	_ "github.com/tecache/te/engine/transport/tcp"
)

// The GPU runtimes besides CUDA (which the engine loads itself): each
// registers with internal/sys/gpu under its location kind.
import _ "github.com/tecache/te/internal/sys/hip"
