package glue

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/kvcache/handoff"
)

// Handoff modes of te.h (TE_HANDOFF_MODE_*). Default lets decode pick push
// and lets prefill accept whatever decode chose.
const (
	ModeDefault = 0
	ModePush    = 1
	ModePull    = 2
)

// Transfer states of te.h (TE_HANDOFF_*), in the order a transfer goes
// through them.
const (
	StateWaiting      = 0
	StateTransferring = 1
	StateDone         = 2
	StateFailed       = 3
	StateAborted      = 4
	StateExpired      = 5
)

var stateNumbers = map[string]int32{
	"waiting": StateWaiting, "transferring": StateTransferring, "done": StateDone,
	"failed": StateFailed, "aborted": StateAborted, "expired": StateExpired,
}

// StateNumber returns the TE_HANDOFF_* number of a sidecar state name (-1
// for a name this library does not know).
func StateNumber(s string) int32 {
	if n, ok := stateNumbers[s]; ok {
		return n
	}
	return -1
}

// ModeOf converts a TE_HANDOFF_MODE_* number.
func ModeOf(op string, m int32) (handoff.Mode, error) {
	switch m {
	case ModeDefault:
		return "", nil
	case ModePush:
		return handoff.Push, nil
	case ModePull:
		return handoff.Pull, nil
	}
	return "", errs.New(errs.InvalidArgument, op, "mode %d is not TE_HANDOFF_MODE_DEFAULT, _PUSH or _PULL", m)
}

// ModeNumber converts a mode back to its TE_HANDOFF_MODE_* number.
func ModeNumber(m handoff.Mode) int32 {
	switch m {
	case handoff.Push:
		return ModePush
	case handoff.Pull:
		return ModePull
	}
	return ModeDefault
}

// DeclTimeout converts a declaration's timeout_ms: 0 is the sidecar's
// default, negative is refused.
func DeclTimeout(op string, ms int64) (time.Duration, error) {
	if ms < 0 {
		return 0, errs.New(errs.InvalidArgument, op, "timeout_ms %d is negative (0 takes the sidecar's default)", ms)
	}
	if ms > maxWaitMS {
		ms = maxWaitMS
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// maxWaitMS caps waits (about 34 years) so that a huge value never
// overflows a time.Duration.
const maxWaitMS = 1 << 40

// abortTimeout bounds the aborts a client's destruction makes for the
// transfers left unfinished: the sidecar expires whatever does not settle.
const abortTimeout = 10 * time.Second

// Xfer is the state behind a te_xfer_t: a handoff transfer and whether the
// caller has seen its end (so freeing it needs no abort).
type Xfer struct {
	T *handoff.Transfer

	mu       sync.Mutex
	finished bool
}

// NewXfer wraps t.
func NewXfer(t *handoff.Transfer) *Xfer { return &Xfer{T: t} }

func (x *Xfer) finish() {
	x.mu.Lock()
	x.finished = true
	x.mu.Unlock()
}

// Finished reports whether a wait or an abort has ended the transfer.
func (x *Xfer) Finished() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.finished
}

// waitCtx returns the context for a wait of timeoutMS (negative: no limit).
func waitCtx(timeoutMS int64) (context.Context, context.CancelFunc) {
	if timeoutMS < 0 || timeoutMS > maxWaitMS {
		return context.WithCancel(context.Background())
	}
	return context.WithTimeout(context.Background(), time.Duration(timeoutMS)*time.Millisecond)
}

// Wait finishes the transfer on this side (handoff.Transfer.Wait). When
// timeoutMS runs out first it returns a Timeout error and the transfer goes
// on: the caller may wait again or abort.
func (x *Xfer) Wait(timeoutMS int64) (handoff.Result, error) {
	ctx, cancel := waitCtx(timeoutMS)
	defer cancel()
	r, err := x.T.Wait(ctx)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		return r, errs.Wrap(errs.Timeout, "handoff wait", err, "transfer %q not finished within %d ms", x.T.ID(), timeoutMS).
			WithHint("wait again, or abort it")
	}
	x.finish()
	return r, err
}

// SendLayer pushes one layer (handoff.Transfer.SendLayer). timeoutMS bounds
// the wait for decode's declaration before the first layer.
func (x *Xfer) SendLayer(layer int, timeoutMS int64) error {
	ctx, cancel := waitCtx(timeoutMS)
	defer cancel()
	err := x.T.SendLayer(ctx, layer)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		return errs.Wrap(errs.Timeout, "handoff send layer", err, "decode has not declared transfer %q within %d ms", x.T.ID(), timeoutMS)
	}
	return err
}

// Abort gives the transfer up (handoff.Transfer.Abort).
func (x *Xfer) Abort(ctx context.Context, reason string) error {
	err := x.T.Abort(ctx, reason)
	if err == nil || errs.CodeOf(err) == errs.InvalidArgument || errs.CodeOf(err) == errs.TransferLost {
		// Aborted, already done, or gone from the sidecar: nothing more to
		// do for it.
		x.finish()
	}
	return err
}

// Release aborts the transfer unless a wait or an abort ended it, so that a
// freed handle never leaves a transfer holding blocks. Errors are dropped:
// the sidecar expires what an abort cannot reach.
func (x *Xfer) Release(timeout time.Duration) {
	if x.Finished() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	x.Abort(ctx, "transfer handle freed")
}

// ReleaseAll releases xs in parallel, each bounded by abortTimeout.
func ReleaseAll(xs []*Xfer) {
	var wg sync.WaitGroup
	for _, x := range xs {
		if x.Finished() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			x.Release(abortTimeout)
		}()
	}
	wg.Wait()
}

// AbortTimeout is the bound te_xfer_free and te_handoff_destroy put on the
// abort of an unfinished transfer.
func AbortTimeout() time.Duration { return abortTimeout }
