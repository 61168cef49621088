//go:build !amd64

package session

import "unsafe"

// vectorGCM: no vector GCM for this architecture; crypto/cipher computes
// every record.
var vectorGCM = false

func ghashBlocks(pow *[32][2]uint64, y *[2]uint64, p *byte, n int) {
	ghashBlocksGo(pow, y, unsafe.Slice(p, 16*n))
}

func ctrBlocks(rk *[11][16]byte, ctr *[16]byte, dst, src *byte, n int) {
	panic("session: no vector AES-CTR on this architecture")
}

func subWord(w uint32) uint32 { panic("session: no AES instructions on this architecture") }
