//go:build !amd64

package session

import "unsafe"

// vectorGHASH: no vector GHASH for this architecture; crypto/cipher's GCM
// computes every tag.
var vectorGHASH = false

func ghashBlocks(pow *[16][2]uint64, y *[2]uint64, p *byte, n int) {
	ghashBlocksGo(pow, y, unsafe.Slice(p, 16*n))
}
