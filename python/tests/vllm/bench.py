"""How long a decode worker of HixlConnector takes to read a request's KV:
from start_load_kv (the worker role's start with the step's read orders) to
get_finished reporting the request, for 1, 32 and 512 blocks of 16 tokens of
a 32-layer model (8 KV heads of 128, fp16: 64 KiB per block and layer), the
prefill worker in another process, over shm and tcp. The floor beside it is
the same bytes moved by memcpy in one process (one memmove per layer: the
block lists are runs), measured in the same run, interleaved. The poll for
the end sleeps 100 us between calls, as an engine loop lets go of the GIL
between steps (a busy poll would starve the worker's read threads).

    PYTHONPATH=build/python build/vllm-venv/bin/python python/tests/vllm/bench.py \\
        [--transport shm,tcp] [--blocks 1,32,512] [--reps 5]

One JSON line per case (docs/VLLM.md, "Figures"); every read is checked
byte for byte after timing."""
import argparse
import ctypes
import json
import multiprocessing as mp
import os
import statistics
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

LAYERS, HEADS, HEAD, TOKENS = 32, 8, 128, 16


def names():
    return ["model.layers.%d.self_attn.attn" % i for i in range(LAYERS)]


def kv_tensors(num_blocks, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randint(-30000, 30000, (num_blocks, HEADS, TOKENS, 2 * HEAD),
                             generator=g, dtype=torch.int16).view(torch.float16)
            for n in names()}


def worker(role, transport, num_blocks):
    from llm_datadist.vllm_connector import _common
    from llm_datadist.vllm_connector._worker import Worker
    opts = _common.options({"transport": transport, "lease_ms": 600000})
    return Worker(opts, "bench-" + role, role, 0, 1, num_blocks, names(), heads=HEADS,
                  block_tokens=TOKENS)


def prefill_main(conn, transport, num_blocks):
    """The prefill worker: holds blocks for each request the parent names,
    and frees them when the decode's read arrived (its own finished())."""
    from llm_datadist.vllm_connector import HixlConnectorMetadata
    w = worker("kv_producer", transport, num_blocks)
    kv = kv_tensors(num_blocks, 1)
    w.register_kv_caches(kv)
    conn.send(w.handshake())
    while True:
        if conn.poll(0.001):
            msg = conn.recv()
            if msg[0] == "exit":
                break
            _, rid, xid, blocks = msg
            w.start(HixlConnectorMetadata(reqs_to_send={rid: (xid, time.time() + 600,
                                                              [blocks])}))
            conn.send(None)
        w.finished()
    w.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="shm,tcp")
    ap.add_argument("--blocks", default="1,32,512")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    counts = [int(x) for x in a.blocks.split(",")]
    num_blocks = max(counts) + 2
    import torch
    from llm_datadist.vllm_connector import HixlConnectorMetadata, _common
    for transport in a.transport.split(","):
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        proc = ctx.Process(target=prefill_main, args=(child, transport, num_blocks), daemon=True)
        proc.start()
        try:
            hs = conn.recv()
            d = worker("kv_consumer", transport, num_blocks)
            shape = (num_blocks, HEADS, TOKENS, 2 * HEAD)
            block_bytes = HEADS * TOKENS * 2 * HEAD * 2
            dkv = {n: torch.zeros(shape, dtype=torch.float16) for n in names()}
            d.register_kv_caches(dkv)
            pkv = kv_tensors(num_blocks, 1)          # the prefill's bytes: the checks' and
            floor_dst = {n: torch.zeros(shape, dtype=torch.float16) for n in names()}  # floor's
            serial = 0
            for n in counts:
                # Prefill blocks from 1 on, decode blocks from the top.
                remote = list(range(1, n + 1))
                local = list(range(num_blocks - n, num_blocks))
                ours, floor = [], []
                for rep in range(a.reps + 1):        # the first of each is a warm-up
                    serial += 1
                    rid, xid = "r%d" % serial, 1000 + serial
                    conn.send(("hold", rid, xid, remote))
                    conn.recv()
                    params = {"remote_request_id": rid, "remote_engine_id": "bench-kv_producer",
                              "remote_block_ids": remote,
                              "hixl": {"v": _common.PARAMS_VERSION,
                                       "ranks": [[hs["address"], hs["cluster_id"]]],
                                       "xid": xid, "expires_at": time.time() + 600,
                                       "block_size": TOKENS, "tp_size": 1,
                                       "layout": hs["layout"]}}
                    spec = _common.RemoteSpec.parse(params)
                    for t in dkv.values():
                        t[local] = 0
                    meta = HixlConnectorMetadata(reqs_to_recv={rid: (spec, [local], 0, True)})
                    t0 = time.perf_counter()
                    d.start(meta)
                    while True:
                        _, recv = d.finished()
                        if rid in recv:
                            break
                        time.sleep(0.0001)
                    t1 = time.perf_counter()
                    if d.failed_recv():
                        raise SystemExit("read of %d blocks failed: %s" % (n, d.recent_errors))
                    for name in names():     # every byte (as int16: random bits hold NaNs)
                        if not torch.equal(dkv[name][local].view(torch.int16),
                                           pkv[name][remote].view(torch.int16)):
                            raise SystemExit("layer %s: the blocks read differ" % name)
                    f0 = time.perf_counter()
                    for name in names():
                        src, dst = pkv[name][remote[0]], floor_dst[name][local[0]]
                        ctypes.memmove(dst.data_ptr(), src.data_ptr(), n * block_bytes)
                    f1 = time.perf_counter()
                    if not torch.equal(floor_dst[names()[-1]][local].view(torch.int16),
                                       pkv[names()[-1]][remote].view(torch.int16)):
                        raise SystemExit("the floor's copy differs")
                    if rep:
                        ours.append(t1 - t0)
                        floor.append(f1 - f0)
                us, fus = statistics.median(ours) * 1e6, statistics.median(floor) * 1e6
                nbytes = n * LAYERS * HEADS * TOKENS * 2 * HEAD * 2
                print(json.dumps({"transport": transport, "blocks": n, "layers": LAYERS,
                                  "bytes": nbytes, "us": round(us, 1),
                                  "gbps": round(nbytes / us / 1e3, 2),
                                  "baseline": "memcpy (one process)",
                                  "baseline_us": round(fus, 1), "ratio": round(fus / us, 3),
                                  "reps": a.reps}), flush=True)
            d.shutdown()
        finally:
            conn.send(("exit",))
            proc.join(30)
            if proc.is_alive():
                proc.kill()


if __name__ == "__main__":
    main()
