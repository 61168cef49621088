"""mooncake.engine on top of te: Mooncake's TransferEngine Python API.

Method names, arguments, defaults and return conventions follow Mooncake's
binding: methods return 0 on success and a negative number on failure (never
raise for a failed transfer), asynchronous batch calls return a batch id that
is 0 on failure, allocate_managed_buffer returns 0 on failure. The negative
numbers are te's error codes (te.h TE_ERR_*), which are more specific than
Mooncake's -1; callers that test "!= 0" or "< 0" see no difference.

Differences a caller may notice:

* protocol is advisory: te picks the best transport both engines have
  (local, shm, rdma, tcp). A protocol te does not have here ("rdma" on a
  machine without RDMA, say) logs a warning and falls back; it is not an
  error. MC_FORCE_TCP=1 forces tcp, as in Mooncake.
* transport_hint is accepted and ignored, as in Mooncake builds without TENT.
* allocate_managed_buffer maps and registers each buffer on its own rather
  than carving a 2 GiB pool at initialize.
* MC_TRANSFER_TIMEOUT (seconds, at least 5) bounds each transfer, as in
  Mooncake; sync calls block until their transfers end.

GPU memory: as in Mooncake, register_memory(tensor.data_ptr(), tensor.nbytes)
and batch_register_memory(ptrs, sizes) register with location "*", so te
detects device memory from the pointer (cuda:N) through the CUDA driver.
Tensor objects themselves are accepted too (capacity may then be omitted):
they register at their own device, "cuda:N" for a CUDA tensor, which fails
cleanly (NotSupported, -10) in a process without CUDA.
"""

import ctypes
import enum
import logging
import mmap
import os
import threading

import te

log = logging.getLogger("mooncake.engine")

P2PHANDSHAKE = "P2PHANDSHAKE"


class TransferOpcode(enum.IntEnum):
    Read = 0
    Write = 1
    READ = 0
    WRITE = 1


Read = TransferOpcode.Read
Write = TransferOpcode.Write


class TransferNotify:
    """A notification: (name, msg)."""

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __eq__(self, other):
        return isinstance(other, TransferNotify) and (self.name, self.msg) == (other.name, other.msg)

    def __repr__(self):
        return f"TransferNotify(name={self.name!r}, msg={self.msg!r})"


def _split_host(local_hostname):
    """host and port (0 when absent) of "host", "host:port" or "[v6]:port"."""
    s = local_hostname or ""
    if s.startswith("["):
        host, _, rest = s[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:] else 0
    if s.count(":") == 1:
        host, port = s.split(":")
        return host, int(port) if port else 0
    return s, 0


def _conn_string(metadata_server, metadata_type):
    if metadata_server == P2PHANDSHAKE:
        return P2PHANDSHAKE
    if "://" in metadata_server:
        return metadata_server
    return f"{metadata_type}://{metadata_server}"


def _show(addr):
    if te.tensors.is_tensor(addr):
        return f"tensor at {int(addr.data_ptr()):#x} on {te.location_of(addr)}"
    try:
        return f"{int(addr):#x}"
    except (TypeError, ValueError):
        return repr(addr)


def _rc(e):
    """The negative return value for a te error (or -1 for anything else)."""
    if isinstance(e, te.TeError) and e.code:
        return -e.code
    return -1


class TransferEngine:
    TransferOpcode = TransferOpcode

    def __init__(self):
        self._engine = None
        self._segments = {}
        self._seg_lock = threading.Lock()
        self._managed = {}  # address -> mmap
        self._managed_lock = threading.Lock()
        self._batches = {}  # batch id -> te.Batch of the async calls

    # -- initialisation ---------------------------------------------------
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Start the engine. metadata_server: "P2PHANDSHAKE", a URL with a
        scheme (etcd://, http://, redis://), or host:port of etcd."""
        if metadata_server == P2PHANDSHAKE:
            return self.initialize_ext(local_hostname, P2PHANDSHAKE, protocol, device_name, "")
        if "://" in metadata_server:
            scheme, _, rest = metadata_server.partition("://")
            return self.initialize_ext(local_hostname, rest, protocol, device_name, scheme)
        return self.initialize_ext(local_hostname, metadata_server, protocol, device_name, "etcd")

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name, metadata_type):
        if self._engine is not None:
            log.warning("TransferEngine.initialize called twice; keeping the first engine")
            return 0
        conn = _conn_string(metadata_server, metadata_type)
        try:
            host, port = _split_host(local_hostname)
        except ValueError:
            log.error("local_hostname %r is not host[:port]", local_hostname)
            return -te.InvalidArgument.code
        # ":port" binds the host the engine advertises (local_hostname),
        # not every interface; Mooncake binds the same way.
        kw = {"metadata": conn, "hostname": host or None, "listen_addr": f":{port}"}
        if conn != P2PHANDSHAKE:
            kw["segment_name"] = local_hostname
        t = os.environ.get("MC_TRANSFER_TIMEOUT")
        if t:
            try:
                kw["transfer_timeout"] = max(5, int(t))
            except ValueError:
                log.warning("ignoring MC_TRANSFER_TIMEOUT=%r", t)
        if os.environ.get("MC_FORCE_TCP", "").lower() in ("1", "true", "yes", "on"):
            kw["force_transport"] = "tcp"
        if device_name:
            log.info("device_name %r: te picks devices itself", device_name)
        try:
            self._engine = te.Engine(**kw)
        except te.TeError as e:
            log.error("initialize: %s", e)
            return _rc(e)
        proto = (protocol or "").lower()
        have = self._engine.stats().get("transports", [])
        if proto and proto not in have:
            log.warning("protocol %r is not available here (have %s); falling back to the best available transport",
                        protocol, ", ".join(have))
        return 0

    def get_rpc_port(self):
        return self._engine.rpc_port

    def get_engine(self):
        """The underlying te.Engine (Mooncake returns its C++ engine here)."""
        return self._engine

    # -- memory -----------------------------------------------------------
    def register_memory(self, buffer_addr, capacity=None, location="*"):
        try:
            if te.tensors.is_tensor(buffer_addr):
                self._engine.register(buffer_addr, capacity, location=location)
                return 0
            self._engine.register(int(buffer_addr), int(capacity), location=location or "*")
            return 0
        except te.TeError as e:
            log.error("register_memory(%s, %s): %s", _show(buffer_addr), capacity, e)
            return _rc(e)

    def unregister_memory(self, buffer_addr):
        try:
            self._engine.unregister(buffer_addr if te.tensors.is_tensor(buffer_addr) else int(buffer_addr))
            return 0
        except te.TeError as e:
            log.error("unregister_memory(%s): %s", _show(buffer_addr), e)
            return _rc(e)

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        if len(buffer_addresses) != len(capacities):
            log.error("batch_register_memory: %d addresses, %d capacities", len(buffer_addresses), len(capacities))
            return -te.InvalidArgument.code
        try:
            self._engine.register_batch([(a if te.tensors.is_tensor(a) else int(a), None if c is None else int(c))
                                         for a, c in zip(buffer_addresses, capacities)],
                                        location=location or "*")
            return 0
        except te.TeError as e:
            log.error("batch_register_memory: %s", e)
            return _rc(e)

    def batch_unregister_memory(self, buffer_addresses):
        try:
            self._engine.unregister_batch([a if te.tensors.is_tensor(a) else int(a) for a in buffer_addresses])
            return 0
        except te.TeError as e:
            log.error("batch_unregister_memory: %s", e)
            return _rc(e)

    # -- segments -----------------------------------------------------------
    def _segment(self, name):
        with self._seg_lock:
            s = self._segments.get(name)
            if s is None:
                s = self._engine.open_segment(name)
                self._segments[name] = s
            return s

    def _forget(self, name, err):
        # A peer that is gone or changed: drop the cached handle so the next
        # call opens the segment afresh, as Mooncake does.
        if isinstance(err, (te.SegmentNotFound, te.PeerUnreachable, te.StaleDescriptor)):
            with self._seg_lock:
                s = self._segments.pop(name, None)
            if s is not None:
                try:
                    s.close()
                except te.TeError:
                    pass

    def get_first_buffer_address(self, segment_name):
        try:
            bufs = self._segment(segment_name).buffers()
        except te.TeError as e:
            log.error("get_first_buffer_address(%s): %s", segment_name, e)
            return 0
        return bufs[0][0] if bufs else 0

    # -- transfers ----------------------------------------------------------
    def _requests(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode):
        if not (len(buffers) == len(peer_buffer_addresses) == len(lengths)):
            raise te.InvalidArgument("buffers, peer_buffer_addresses and lengths have different sizes")
        if not buffers:
            raise te.InvalidArgument("no buffers")
        seg = self._segment(target_hostname)
        op = te.WRITE if int(opcode) == TransferOpcode.Write else te.READ
        return [(op, int(b), seg, int(p), int(n)) for b, p, n in zip(buffers, peer_buffer_addresses, lengths)]

    def _sync(self, what, target_hostname, buffers, peers, lengths, opcode, notify):
        try:
            reqs = self._requests(target_hostname, buffers, peers, lengths, opcode)
            n = None if notify is None else (target_hostname, notify.name, notify.msg)
            self._engine.transfer(reqs, notify=n)
            return 0
        except te.TeError as e:
            log.error("%s to %s: %s", what, target_hostname, e)
            self._forget(target_hostname, e)
            return _rc(e)

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        return self._sync("transfer_sync_write", target_hostname, [buffer], [peer_buffer_address], [length],
                          TransferOpcode.Write, None)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        return self._sync("transfer_sync_read", target_hostname, [buffer], [peer_buffer_address], [length],
                          TransferOpcode.Read, None)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode, notify=None,
                      transport_hint=""):
        return self._sync("transfer_sync", target_hostname, [buffer], [peer_buffer_address], [length], opcode,
                          notify)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  transport_hint=""):
        return self._sync("batch_transfer_sync_write", target_hostname, buffers, peer_buffer_addresses, lengths,
                          TransferOpcode.Write, None)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self._sync("batch_transfer_sync_read", target_hostname, buffers, peer_buffer_addresses, lengths,
                          TransferOpcode.Read, None)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode, notify=None,
                            transport_hint=""):
        return self._sync("batch_transfer_sync", target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
                          notify)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths, opcode,
                             transport_hint=""):
        """Submit and return a batch id (0 on failure) for
        get_batch_transfer_status."""
        b = None
        try:
            reqs = self._requests(target_hostname, buffers, peer_buffer_addresses, lengths, opcode)
            b = self._engine.allocate_batch(len(reqs))
            b.submit(reqs)
        except te.TeError as e:
            log.error("batch_transfer_async to %s: %s", target_hostname, e)
            self._forget(target_hostname, e)
            if b is not None:
                b.free()
            return 0
        self._batches[b.handle] = b
        return b.handle

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                   transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses, lengths,
                                         TransferOpcode.Write)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses, lengths, transport_hint=""):
        return self.batch_transfer_async(target_hostname, buffers, peer_buffer_addresses, lengths,
                                         TransferOpcode.Read)

    def get_batch_transfer_status(self, batch_ids):
        """Wait for the batches; 0 when all completed, negative when one
        failed. The batches are released either way."""
        rc = 0
        for bid in batch_ids:
            b = self._batches.pop(bid, None)
            if b is None:
                log.error("get_batch_transfer_status: unknown batch id %#x", bid)
                rc = rc or -te.InvalidArgument.code
                continue
            try:
                b.wait()
            except te.TeError as e:
                log.error("batch %#x: %s", bid, e)
                rc = rc or _rc(e)
            finally:
                try:
                    b.free()
                except te.TeError:
                    pass
        return rc

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length, transport_hint=""):
        """Submit one WRITE; returns a batch id for transfer_check_status, or
        a negative number on failure."""
        bid = self.batch_transfer_async(target_hostname, [buffer], [peer_buffer_address], [length],
                                        TransferOpcode.Write)
        return bid if bid else -1

    def transfer_check_status(self, batch_id):
        """1 completed, 0 in progress, -1 failed, -2 timed out (the batch is
        released once it ended)."""
        b = self._batches.get(batch_id)
        if b is None:
            return -1
        st = b.status()
        if st.state == te.PENDING:
            return 0
        self._batches.pop(batch_id, None)
        try:
            b.free()
        except te.TeError:
            pass
        if st.state == te.COMPLETED:
            return 1
        return -2 if st.state == te.TIMEOUT else -1

    # -- notifications and probes -----------------------------------------
    def get_notifies(self):
        try:
            return [TransferNotify(n, m.decode("utf-8", "surrogateescape")) for n, m in self._engine.notifies()]
        except te.TeError as e:
            log.error("get_notifies: %s", e)
            return []

    def send_probe(self, peer_server_name):
        """0 when the peer answers, negative otherwise."""
        try:
            self._engine.probe(peer_server_name)
            return 0
        except te.TeError as e:
            log.warning("send_probe(%s): %s", peer_server_name, e)
            return _rc(e)

    # -- managed buffers ------------------------------------------------------
    def allocate_managed_buffer(self, length):
        """Map and register length bytes; returns the address or 0."""
        try:
            m = mmap.mmap(-1, int(length))
        except (OSError, ValueError) as e:
            log.error("allocate_managed_buffer(%d): %s", length, e)
            return 0
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        try:
            self._engine.register(addr, int(length), location="*")
        except te.TeError as e:
            log.error("allocate_managed_buffer(%d): %s", length, e)
            m.close()
            return 0
        with self._managed_lock:
            self._managed[addr] = m
        return addr

    def free_managed_buffer(self, buffer_addr, length):
        with self._managed_lock:
            m = self._managed.pop(int(buffer_addr), None)
        if m is None:
            log.error("free_managed_buffer: %#x was not allocated here", buffer_addr)
            return -te.InvalidArgument.code
        rc = 0
        try:
            self._engine.unregister(int(buffer_addr))
        except te.TeError as e:
            rc = _rc(e)
        # The from_buffer export is gone with the temporary c_char object;
        # closing unmaps.
        m.close()
        return rc

    @staticmethod
    def write_bytes_to_buffer(dest_address, src_ptr, length):
        data = bytes(src_ptr)
        if int(length) > len(data):
            log.error("write_bytes_to_buffer: %d bytes asked, %d given", length, len(data))
            return -te.InvalidArgument.code
        ctypes.memmove(int(dest_address), data, int(length))
        return 0

    @staticmethod
    def read_bytes_from_buffer(source_address, length):
        return ctypes.string_at(int(source_address), int(length))

    # -- lifetime (not in Mooncake's API; useful in tests) ----------------------
    def close(self):
        with self._seg_lock:
            segs, self._segments = list(self._segments.values()), {}
        for s in segs:
            try:
                s.close()
            except te.TeError:
                pass
        if self._engine is not None:
            self._engine.close()
        with self._managed_lock:
            ms, self._managed = list(self._managed.values()), {}
        for m in ms:
            m.close()
