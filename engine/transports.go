package engine

// The transports an engine can install; each registers itself in init.
import (
	_ "github.com/tecache/te/engine/transport/local"
)
