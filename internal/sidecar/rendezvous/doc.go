// Package rendezvous is te-sidecar's prefill-to-decode handoff rendezvous: a
// state machine of transfers (Table) and its JSON-over-HTTP routes (Mount),
// testable without the sidecar binary. The client that prefill and decode
// processes use is github.com/tecache/te/kvcache/handoff.
//
// # Protocol
//
// Decode declares where a request's KV must go with POST /handoff/expect
// (a Decl: id, its engine segment, its kvcache layout with base addresses,
// its block ids, the mode and a timeout). Prefill declares that the KV is
// ready with POST /handoff/ready (its segment, layout and block ids).
// Whichever comes second pairs the transfer: the sidecar checks that a plan
// can be made from the two caches (same dtype, block size, head dim, block
// count; a mismatch fails the transfer at once) and moves it to
// transferring. The moving side (prefill in push mode, decode in pull mode)
// receives the other side's declaration in its answer or from
// GET /handoff/wait, moves the bytes with its engine and reports with
// POST /handoff/complete. Its engine also notifies the other side
// (NotifyName), so that side needs no sidecar round trip to learn of the
// completion. Either side may POST /handoff/abort; GET /handoff/status
// reads a transfer.
//
// # States
//
//	waiting       one side has declared
//	transferring  both have; the mover moves the bytes
//	done          the mover reported success
//	failed        the mover reported a failure, or the caches do not match
//	aborted       a side aborted
//	expired       not paired, or not completed, by the deadline
//
// A transfer is settled once the mover is known not to touch either side's
// memory for it any more: at once when it ends before pairing or by the
// mover's report; when it is aborted or expires while the mover moves, at
// the mover's late report or after Config.SettleGrace. Clients release
// blocks once settled, so they are always released. Finished transfers stay
// queryable for Config.Retain.
//
// # Restarts
//
// Every answer carries the sidecar's instance id (random per start), in the
// body and in the X-Te-Sidecar-Instance header. A client that sees another
// instance, or a 404 for an id it declared, knows the transfer was lost
// (errs.TransferLost) instead of waiting for it.
//
// # Errors
//
// Refusals are JSON ErrorBody values with a stable errs code: 400 for a
// malformed body or declaration, 404 for an unknown id, 409 for a duplicate
// declaration or a request that conflicts with the transfer's state (the
// body then carries the transfer's record, e.g. aborted), 503 when the
// table is full or the sidecar is shutting down.
//
// # Metrics
//
// te_handoff_transfers{state} (held now), te_handoff_transfers_total{mode,
// state}, te_handoff_bytes_total{mode}, te_handoff_requests_total{mode},
// te_handoff_failures_total{reason}, te_handoff_rejected_total{reason} and
// the histograms te_handoff_pair_wait_seconds, te_handoff_transfer_seconds
// {mode}, te_handoff_move_seconds{mode} and te_handoff_seconds{mode,state}.
package rendezvous
