// Package runtimes links every GPU runtime te has into a program: importing
// it registers each vendor package with package gpu, so code above names a
// location kind ("cuda", "hip"), never a vendor package.
package runtimes

import (
	// Each registers its gpu.Driver from init.
	_ "github.com/tecache/te/internal/sys/cuda"
	_ "github.com/tecache/te/internal/sys/hip"
)
