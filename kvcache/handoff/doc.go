// Package handoff is the client side of te's prefill-to-decode KV-cache
// handoff: what a prefill process and a decode process call to move a
// request's KV blocks from one to the other through te-sidecar.
//
// Decode declares where the KV must go (Client.Expect: its engine segment,
// its cache layout with base addresses, its block ids, the mode); prefill
// declares that the KV is ready (Client.Ready: its layout and block ids).
// Whichever comes second pairs the transfer. Then the side that moves the
// bytes plans the copy with package kvcache, submits it through its engine
// and reports the outcome to the sidecar:
//
//   - Push (the default, as Mooncake and SGLang do): prefill WRITEs into
//     decode's blocks. Prefill may send layer by layer (Transfer.SendLayer)
//     as layers are computed, so that the transfer overlaps the prefill.
//   - Pull (as NIXL does): decode READs from prefill's blocks once prefill
//     has declared them ready.
//
// The moving side's batch carries an engine notification (NotifyName, with
// the transfer id) to the other side, so the waiting side learns of the
// completion without a sidecar round trip; it also long-polls the sidecar,
// which is how it learns of a failure, an abort or an expiry.
//
// Transfer.Wait (Send on the prefill side) finishes a transfer on either
// side and returns only once this side's memory is no longer touched for
// it; Transfer.Abort gives a transfer up and, likewise, returns once the
// moving side has stopped, so blocks can always be released. Every
// transfer has a deadline (Request.Timeout) after which the sidecar expires
// it.
//
// Errors are *errs.Error values with stable codes: Canceled for an aborted
// transfer, Timeout for an expired one, InvalidArgument for a bad
// declaration or caches that do not match (dtype, block size, head dim,
// block counts), the mover's transport code for a failed transfer, and
// TransferLost when the sidecar restarted (its instance id changed) or no
// longer knows the transfer: the caller must not wait for it any more.
//
// With a cluster secret on te-sidecar, the client sends a token derived
// from it (from Options.AuthSecret, Options.AuthSecretFile,
// TE_AUTH_SECRET_FILE or TE_AUTH_SECRET; package authsecret documents the
// derivation): its own client token for its engine's segment name, which
// it sends as its name, so the sidecar keeps its quotas apart from other
// clients'. Given Options.Token instead, it sends that, and its quotas are
// those of its host. The derived token goes only over connections whose
// server first proved that it holds the secret (GET /metadata/proof, package
// sidecarproof): given any other server, the client sends nothing and fails
// with Unauthenticated, naming the URL and saying the token was not sent.
// A token given in Options.Token is sent as given. Each declaration's answer carries this side's
// capability for the transfer, which the Transfer presents on every later
// request: nobody else can report, abort or read the transfer. A sidecar
// that wants a token this client lacks answers with an Unauthenticated
// error; a client over its quota gets ResourceExhausted.
//
// Each declaration grants an engine window over the side's blocks, which
// the mover presents and the side revokes when it is done. It is granted
// to the engine Request.Peer names, or, when that is empty, to the first
// engine that uses it (engine.GrantWindowToFirst); once the sidecar pairs
// the transfer, each side binds its window to the engine it was paired
// with (engine.BindWindow). With a cluster secret no other engine can use
// the key then, even one that learned it, and a side whose window another
// engine used first fails its Wait with AccessDenied instead of reporting
// the transfer done. Without a secret the key is a bearer capability over
// tcp, shm and cxl (SECURITY.md).
//
// The memory of both layouts must be registered with the engines
// (kvcache.Layout.Regions lists it) for as long as transfers use it. A
// Client reads its engine's notifications; applications that use
// notifications for themselves read the others with Client.Notifies.
package handoff
