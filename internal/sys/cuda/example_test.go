package cuda_test

import (
	"fmt"

	"github.com/tecache/te/internal/sys/cuda"
)

// Load reports why CUDA cannot be used instead of failing; calls that need a
// context run inside With.
func ExampleLoad() {
	l, err := cuda.Load()
	if err != nil {
		fmt.Println("running without CUDA:", err)
		return
	}
	dev, _ := l.DeviceGet(0)
	ctx, err := l.PrimaryCtxRetain(dev)
	if err != nil {
		return
	}
	defer l.PrimaryCtxRelease(dev)
	l.With(ctx, func() error {
		p, err := l.MemAlloc(1 << 20)
		if err != nil {
			return err
		}
		defer l.MemFree(p)
		info, _ := l.PointerInfo(p)
		fmt.Println(info.Type, info.Device)
		return nil
	})
}
