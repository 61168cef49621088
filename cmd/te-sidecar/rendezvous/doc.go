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
// # Capabilities
//
// The answer to a side's declaration carries that side's capability for
// the transfer (Record.Capability: 128 random bits as 32 hex digits, a new
// one per side and transfer). Every later request about the transfer
// presents it in the X-Te-Capability header: complete is accepted only with
// the mover's capability once the transfer is paired, abort, status and
// wait with either side's. A missing or foreign capability gets the answer
// an unknown id gets (404, code NotFound, the same message but for the id,
// the same metrics label), so nobody learns which ids exist. The side is
// taken from the capability, so a role in the query or body that names the
// other side is refused with 403 (code Unauthenticated), as is a complete
// by the side that does not move. Refusals of a conflicting declaration (409) carry the
// transfer's state but neither declaration nor capability. So even a holder
// of the cluster secret (which te-sidecar's bearer token proves) cannot
// forge another transfer's outcome, abort it, or read its declarations.
//
// # Bounds
//
// A request body over Config.MaxBody is refused with 413 (read to its end
// and discarded, so that the client reads the answer). Each client (as the
// Mux names it: te-sidecar uses the name a client token proves, else the
// source host, never a self-declared name) may hold Config.ClientTransfers
// unpaired transfers and Config.ClientBytes of declarations (estimated by
// Cost) of live transfers; past either it gets 429 with code
// ResourceExhausted, the others carry on. When the table reaches
// Config.MaxTransfers records or Config.MaxBytes of declarations, the
// oldest finished transfers are dropped first (by count), then the oldest
// unpaired transfer of the heaviest client (the most unpaired transfers
// when full by count, the most bytes when full by bytes) is evicted
// (expired with ResourceExhausted, settled: nothing moved) when that client
// holds more than the newcomer would. Paired and transferring ones are
// never evicted, so only a table full of live transfers, or of equal
// holders, answers 503 (ResourceExhausted). Finished transfers release
// their declarations at once.
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
// malformed body or declaration (bodies are decoded strictly: an unknown
// field is refused by name, in the declaration's layout too), 403 for the
// other side's capability, 404 for an unknown id or a capability that is
// not the transfer's, 409 for a duplicate declaration or a request that
// conflicts with the transfer's state (the body then carries the transfer's
// record, e.g. aborted), 413 for a body over the limit, 429 for a client
// over its quota, 503 when the table is full or the sidecar is shutting
// down. te-sidecar answers 401 before any of these when it has a cluster
// secret and the request lacks its token.
//
// # Metrics
//
// te_handoff_transfers_held{state} (held now), te_handoff_transfers_total{mode,
// state}, te_handoff_bytes_total{mode}, te_handoff_requests_total{mode},
// te_handoff_failures_total{reason}, te_handoff_rejected_total{reason}
// (every refusal, by reason), te_handoff_declaration_bytes,
// te_handoff_clients, te_handoff_long_polls and the histograms te_handoff_pair_wait_seconds, te_handoff_transfer_seconds
// {mode}, te_handoff_move_seconds{mode} and te_handoff_seconds{mode,state}.
package rendezvous
