"""The client side of test_handoff_proof: a process started with "spawn" and
its own environment (libte reads TE_AUTH_SECRET when the process starts), so
that the cluster secret reaches the handoff client as it does in a deployed
worker."""


def declare(conn, sidecar):
    import te
    from te.kvcache import Handoff, Layout

    from handoff_peers import SHAPE

    e = te.Engine(listen_addr="127.0.0.1:0", hostname="127.0.0.1", rpc_timeout=10)
    layout_shape = Layout(num_blocks=4, **SHAPE)
    bufs = [bytearray(layout_shape.layer_bytes) for _ in range(4)]
    layout = layout_shape.with_bases(bases=[te.address_of(b)[0] for b in bufs])
    e.register_batch(bufs)
    h = Handoff(e, sidecar)
    try:
        x = h.expect("proof-1", layout, [0, 1], timeout=30)
    except te.TeError as err:
        conn.send(("error", type(err).__name__, str(err)))
    else:
        x.abort("test over")
        x.close()
        conn.send(("ok",))
    h.close()
    e.close()
