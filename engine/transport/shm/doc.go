// Package shm is the same-host transport: when the peer is another process on
// this machine, bytes move with process_vm_readv/process_vm_writev, one copy
// from kernel to kernel, with no socket and no staging buffer. Up to IOVMax
// (1024) requests go into one system call (requests adjacent on a side share
// one iovec there); when the kernel stops short the transfer goes on where
// it stopped, and a range the kernel refuses fails alone. Batches are spread
// over copy workers through an unbounded queue, so Submit never waits for a
// copy; a batch of at most 64 KiB to an owner whose session and keys are in
// hand is copied in the submitting goroutine (control calls never are).
//
// # Cancellation and Close
//
// Cancel drops the queued spans of the canceled requests at once; a worker
// leaves them out from its next system call on, so a request being copied
// ends once its current process_vm_readv/writev returns (one call moves at
// most a job: shm.job_bytes, 1024 spans). Close fails what is queued, makes
// every worker stop at its next system call and waits for them: no copy
// runs after it returns. Quiesce has nothing to cut: peers reach this
// engine's memory with their own system calls, which the owner does not
// count; the fence for them is the revocation below, which Unregister runs.
//
// # Choosing shm
//
// Describe publishes the engine's host identity (boot id, pid namespace, pid)
// in the descriptor. Reachable accepts a peer only when the boot id and pid
// namespace match ours and the pid is another process (the same process is
// the local transport's job), and only after the kernel has shown it lets us
// at the peer's memory: the first use attaches to the peer and reads a
// 16-byte token from it with process_vm_readv. A refusal (EPERM, ESRCH, a
// wrong token) is remembered for that peer instance, logged once and counted
// in Stats ("probe_refused"), and the engine falls back to the next transport
// (tcp). A later EPERM on a data call does the same.
//
// # What a container needs
//
//   - The same pid namespace as the peer (docker --pid=host or
//     --pid=container:<peer>, Kubernetes shareProcessNamespace: true for
//     containers of one pod). Otherwise the peers see different pid
//     namespaces and shm is not chosen.
//   - The same boot: both see one /proc/sys/kernel/random/boot_id (always true
//     for containers of one host).
//   - Permission to ptrace-attach to the peer, which is what the kernel checks
//     for process_vm_readv/writev: the same uid (real, effective and saved)
//     and a dumpable peer (no prctl(PR_SET_DUMPABLE, 0), no setuid binary),
//     or CAP_SYS_PTRACE (docker --cap-add SYS_PTRACE; Kubernetes
//     securityContext.capabilities.add: ["SYS_PTRACE"]).
//   - Yama: /proc/sys/kernel/yama/ptrace_scope 0 lets any same-uid process
//     in; 1 (Ubuntu's default) lets a process in only to its descendants, or
//     to a process that declared it with prctl(PR_SET_PTRACER, pid) or
//     PR_SET_PTRACER_ANY (the serving process may do that; te does not do it
//     for you), else CAP_SYS_PTRACE is needed; 2 needs CAP_SYS_PTRACE; 3
//     forbids it entirely.
//   - seccomp: the default docker profile allows process_vm_readv/writev only
//     with CAP_SYS_PTRACE.
//
// # Safety: revocation and leases
//
// The initiator writes into the owner's memory without the owner seeing each
// access, so the owner cannot refuse one when it happens (design section 4).
// Instead:
//
//   - A peer first attaches (a session) and asks the owner about every buffer
//     key before its first use (validate); the owner answers only for the
//     current registration of the range, records whom it told, and renews the
//     peer's lease.
//   - Unregister sends a revocation to every peer that was told of the
//     buffer. The peer removes the key (new accesses fail with
//     StaleDescriptor and make the engine fetch the new descriptor), waits
//     for its accesses in flight to the buffer to end, and acknowledges.
//     Unregister returns when every such peer has acknowledged or exited.
//   - A peer that does not acknowledge within RevokeTimeout (default 2 s) is
//     cut off: its session is dropped, so its lease is no longer renewed and
//     its keys no longer validated, and Unregister waits until the lease it
//     holds has lapsed (at most Lease, default 5 s, plus 250 ms for a copy
//     already under way). A peer stops by itself when its lease lapses: it
//     renews the lease whenever less than half is left, before it takes the
//     buffers for a job, and checks it before every system call.
//   - Engine Close revokes every grant the same way, so memory freed after
//     Close is not written either.
//
// Residual risk, stated plainly: the lease is kept by the peer, not enforced
// by the kernel. A peer that is stopped or descheduled for more than half the
// lease between its lease check and the system call that follows (a few
// instructions apart), or whose single system call runs longer than 250 ms
// past its lease (it pages in swapped-out memory, say), can still write after
// the owner's Unregister returned. A peer that does not run te's protocol at
// all (any process with ptrace rights over the owner) can write whenever it
// likes: shm trusts every process the kernel trusts, which is the same trust
// as a debugger's. Where that is not acceptable, force tcp.
//
// # Statistics
//
// Transport.Stats (and Engine.TransportStats()["shm"]) counts, as initiator:
// attached, attach_failed, probe_refused, sessions_open, validations,
// lease_renewals, stale_refused (accesses refused because the key was revoked
// or refused), revokes_received, syscalls, short_syscalls (the kernel stopped
// short), bytes_written, bytes_read; as owner: peers_attached, revokes_sent,
// revokes_acked, peers_cut_off.
//
// # Parameters
//
// Engine params: "shm.lease", "shm.revoke_timeout", "shm.call_timeout"
// (durations such as "5s"), "shm.workers" (copy goroutines, default one per
// core up to 4) and "shm.job_bytes" (bytes a worker moves in one go, default
// 8 MiB; larger requests are cut and spread over the workers).
//
// The control messages (attach, validate, revoke, detach) are wire.KindShm
// calls; their layout is in internal/wire/spec.md.
package shm
