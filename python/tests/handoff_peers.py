"""The prefill process of the two-process handoff tests: started with
multiprocessing's "spawn" method, driven over a Pipe."""

from peers import pattern

LAYERS = 4
SRC_BLOCKS = 12
DST_BLOCKS = 16
SHAPE = dict(format="vllm", order="HND", dtype="bf16", block_size=16, num_heads=2, head_dim=64)


def layer_pattern(layer, n):
    """What prefill's layer `layer` holds (K then V, every block)."""
    return pattern(1000 + layer, n)


def prefill(conn, sidecar):
    import te
    from te.kvcache import Handoff, Layout

    e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", rpc_timeout=10, transfer_timeout=60)
    shape = Layout(num_blocks=SRC_BLOCKS, **SHAPE)
    lb = shape.layer_bytes
    bufs = [bytearray(layer_pattern(l, lb)) for l in range(LAYERS)]
    layout = shape.with_bases(bases=[te.address_of(b)[0] for b in bufs])
    e.register_batch(bufs)
    h = Handoff(e, sidecar)
    held = {}  # transfers declared but not driven: a dropped Transfer would abort
    conn.send("ready")
    while True:
        cmd = conn.recv()
        op = cmd[0]
        try:
            if op == "push":
                _, tid, blocks, layered = cmd
                x = h.ready(tid, layout, blocks, timeout=60)
                if layered:
                    for layer in range(LAYERS - 1):
                        x.send_layer(layer, timeout=60)
                r = x.send(timeout=90)
                conn.send(("ok", vars(r)))
                x.close()
            elif op == "pull":
                _, tid, blocks = cmd
                x = h.ready(tid, layout, blocks, mode="pull", timeout=60)
                r = x.send(timeout=90)
                conn.send(("ok", vars(r)))
                x.close()
            elif op == "ready":
                _, tid, blocks = cmd
                held[tid] = h.ready(tid, layout, blocks, timeout=60)
                conn.send(("ok", None))
            elif op == "send":
                r = held.pop(cmd[1]).send(timeout=90)
                conn.send(("ok", vars(r)))
            elif op == "status":
                conn.send(("ok", vars(held[cmd[1]].status())))
            elif op == "check":
                conn.send(("ok", all(bytes(b) == layer_pattern(l, lb) for l, b in enumerate(bufs))))
            elif op == "exit":
                h.close()
                e.unregister_batch(bufs)
                e.close()
                conn.send(("ok", None))
                return
        except te.TeError as err:
            conn.send(("error", type(err).__name__, str(err)))
