package engine

import (
	"sync/atomic"

	"github.com/tecache/te/engine/transport"
)

type stats struct {
	completed, failed, timedOut, canceled atomic.Uint64
	bytes                                 atomic.Uint64
	notifiesSent, notifiesReceived        atomic.Uint64
	windowsGranted, windowsRevoked        atomic.Uint64
	windowsUnenforced                     atomic.Uint64
}

// Stats are an engine's counters since it started.
type Stats struct {
	Segment    string   `json:"segment"`
	Transports []string `json:"transports"`
	// Caps are the installed transports' declared capabilities.
	Caps             map[string]transport.Caps `json:"caps"`
	Buffers          int                       `json:"buffers"`
	TasksCompleted   uint64                    `json:"tasks_completed"`
	TasksFailed      uint64                    `json:"tasks_failed"`
	TasksTimedOut    uint64                    `json:"tasks_timed_out"`
	BytesTransferred uint64                    `json:"bytes_transferred"`
	NotifiesSent     uint64                    `json:"notifies_sent"`
	NotifiesReceived uint64                    `json:"notifies_received"`
	// Windows granted and revoked (GrantWindow); requests that named a
	// window but went over a transport that cannot honour one.
	WindowsGranted    uint64 `json:"windows_granted"`
	WindowsRevoked    uint64 `json:"windows_revoked"`
	WindowsUnenforced uint64 `json:"windows_unenforced"`
}

// Stats returns the engine's counters.
func (e *Engine) Stats() Stats {
	caps := make(map[string]transport.Caps, len(e.transports))
	for _, t := range e.transports {
		caps[t.Name()] = t.Caps()
	}
	return Stats{
		Caps:             caps,
		Segment:          e.name,
		Transports:       e.Transports(),
		Buffers:          len(e.reg.Regions()),
		TasksCompleted:   e.stats.completed.Load(),
		TasksFailed:      e.stats.failed.Load() + e.stats.canceled.Load(),
		TasksTimedOut:    e.stats.timedOut.Load(),
		BytesTransferred: e.stats.bytes.Load(),
		NotifiesSent:     e.stats.notifiesSent.Load(),
		NotifiesReceived: e.stats.notifiesReceived.Load(),

		WindowsGranted:    e.stats.windowsGranted.Load(),
		WindowsRevoked:    e.stats.windowsRevoked.Load(),
		WindowsUnenforced: e.stats.windowsUnenforced.Load(),
	}
}
