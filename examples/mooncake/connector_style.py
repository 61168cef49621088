"""te's Mooncake drop-in, called the way vLLM's and SGLang's connectors call
Mooncake's TransferEngine.

    python3 examples/mooncake/connector_style.py

A decode process (started by this script) and this prefill process each
create `mooncake.engine.TransferEngine()`, initialize it with P2PHANDSHAKE
metadata (no metadata server), register their KV cache and exchange
"host:rpc_port" session names and addresses out of band (here: a pipe; in
vLLM and SGLang: their own side channel). Prefill then pushes KV blocks with
the calls those connectors use:

* vLLM (MooncakeConnector, vllm/distributed/kv_transfer/kv_connector/v1/
  mooncake_connector.py): initialize(host, "P2PHANDSHAKE", protocol, ""),
  get_rpc_port(), batch_register_memory(ptrs, lens),
  batch_transfer_sync_write(session, src_ptrs, dst_ptrs, lens);
* SGLang (MooncakeKVManager, python/sglang/srt/disaggregation/mooncake/):
  register_memory(ptr, len), transfer_sync(session, src, dst, len,
  TransferOpcode.Write) and batch_transfer_sync(...) for runs of blocks,
  plus batch_transfer_async_write + get_batch_transfer_status.

Every call returns 0 (or a batch id) on success and a negative number on
failure, as Mooncake's binding does. Those signatures are taken from the two
projects' sources; vLLM and SGLang themselves are not installed here, so
this program stands in for them.
"""

import ctypes
import mmap
import os
import secrets
import subprocess
import sys

from mooncake.engine import TransferEngine, TransferOpcode

BLOCK = 64 << 10
BLOCKS = 16


def kv_cache():
    """A stand-in for a KV cache tensor: anonymous memory and its address."""
    m = mmap.mmap(-1, BLOCK * BLOCKS)
    return m, ctypes.addressof(ctypes.c_char.from_buffer(m))


def fill(m, block, seed):
    m[block * BLOCK:(block + 1) * BLOCK] = bytes([(seed + block) & 0xFF]) * BLOCK


def must(rc, what):
    if rc != 0:
        raise SystemExit(f"{what} returned {rc}")


def decode():
    engine = TransferEngine()
    must(engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), "initialize")
    m, base = kv_cache()
    must(engine.batch_register_memory([base], [BLOCK * BLOCKS]), "batch_register_memory")
    print(f"127.0.0.1:{engine.get_rpc_port()} {base}", flush=True)
    sys.stdin.readline()  # prefill pushed
    # Prefill's blocks 0..7 land in decode's blocks 8..15.
    ok = all(m[(8 + b) * BLOCK:(9 + b) * BLOCK] == bytes([(100 + b) & 0xFF]) * BLOCK for b in range(8))
    print("decode: KV blocks", "correct" if ok else "WRONG", flush=True)
    engine.close()
    return 0 if ok else 1


def prefill():
    # The cluster secret reaches a drop-in engine through the environment
    # (Mooncake's API has no argument for it); the decode process inherits
    # it. It must be set before the first te call of the process.
    os.environ.setdefault("TE_AUTH_SECRET", secrets.token_hex(16))
    child = subprocess.Popen([sys.executable, __file__, "decode"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        session, remote = child.stdout.readline().split()
        remote = int(remote)
        engine = TransferEngine()
        # "rdma" would be used on a cluster; te falls back to the best
        # transport this machine has, with a warning.
        must(engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", ""), "initialize")
        m, base = kv_cache()
        for b in range(8):
            fill(m, b, 100)
        # SGLang registers each buffer; vLLM registers them all in one call.
        must(engine.register_memory(base, BLOCK * BLOCKS), "register_memory")

        # vLLM: one synchronous batch for blocks 0..3 -> 8..11.
        src = [base + b * BLOCK for b in range(4)]
        dst = [remote + (8 + b) * BLOCK for b in range(4)]
        must(engine.batch_transfer_sync_write(session, src, dst, [BLOCK] * 4), "batch_transfer_sync_write")
        # SGLang: one block with transfer_sync, a run with batch_transfer_sync.
        must(engine.transfer_sync(session, base + 4 * BLOCK, remote + 12 * BLOCK, BLOCK, TransferOpcode.Write),
             "transfer_sync")
        must(engine.batch_transfer_sync(session, [base + 5 * BLOCK], [remote + 13 * BLOCK], [BLOCK],
                                        TransferOpcode.Write), "batch_transfer_sync")
        # SGLang's asynchronous path: submit, then wait for the batch ids.
        bid = engine.batch_transfer_async_write(session, [base + 6 * BLOCK, base + 7 * BLOCK],
                                                [remote + 14 * BLOCK, remote + 15 * BLOCK], [BLOCK, BLOCK])
        if bid == 0:
            raise SystemExit("batch_transfer_async_write returned 0")
        must(engine.get_batch_transfer_status([bid]), "get_batch_transfer_status")
        print(f"prefill: pushed 8 KV blocks to {session}")
        engine.close()
        child.stdin.write("done\n")
        child.stdin.flush()
        print(child.stdout.readline().strip())
        return child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "decode":
        sys.exit(decode())
    rc = prefill()
    print("connector_style:", "ok" if rc == 0 else "FAILED")
    sys.exit(rc)
