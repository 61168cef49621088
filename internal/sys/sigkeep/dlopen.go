package sigkeep

import "github.com/ebitengine/purego"

// Dlopen is purego.Dlopen with the fault handlers kept: a library's
// constructors run inside dlopen.
func Dlopen(path string, mode int) (h uintptr, err error) {
	Around(func() { h, err = purego.Dlopen(path, mode) })
	return h, err
}
