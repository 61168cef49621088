//go:build !amd64 && !arm64

package ibv

// pthreadMutexSize is a placeholder: Load refuses architectures whose
// layouts were not checked.
const pthreadMutexSize = 40
