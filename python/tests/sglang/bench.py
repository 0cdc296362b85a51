"""How long the hixl backend takes to move one request's KV from a prefill
rank to a decode rank, driven through SGLang's own sender and receiver code
(node.py processes), beside a baseline measured in the same run: copying the
same bytes with memcpy in one process (numpy, one thread, page runs as
contiguous copies).

  PYTHONPATH=build/python build/sglang-venv/bin/python python/tests/sglang/bench.py \
      [--transport tcp|shm] [--layers 32] [--page-kib 16] [--pages 64,512] [--repeat 5]

Time per request: from the prefill's first send() to the first poll on the
decode that says Success (the notification arrived after the data); the two
processes' clocks are the same host's. One chunk per request; pages laid out
contiguously on both sides (SGLang's allocator usually gives runs), so each
layer's K and V are one descriptor. Prints one JSON row per size and a table.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sglang_backend import Node, free_port, pages  # noqa: E402


def memcpy_floor(nbufs, page_bytes, npages, repeat):
    src = [np.ones(npages * page_bytes, dtype=np.uint8) for _ in range(nbufs)]
    dst = [np.zeros(npages * page_bytes, dtype=np.uint8) for _ in range(nbufs)]
    for s, d in zip(src, dst):  # fault the pages in first
        np.copyto(d, s)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for s, d in zip(src, dst):
            np.copyto(d, s)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="tcp")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--page-kib", type=int, default=16, help="bytes of one page of one K or V")
    ap.add_argument("--pages", default="8,64,512")
    ap.add_argument("--repeat", type=int, default=5)
    o = ap.parse_args()
    sizes = [int(x) for x in o.pages.split(",")]
    cap = max(sizes)
    head_bytes = 256
    heads = 4
    page_size = o.page_kib * 1024 // (heads * head_bytes)
    extra = ["--layers", o.layers, "--pages", cap, "--heads", heads, "--page-size", page_size,
             "--head-bytes", head_bytes, "--fast"]
    extra = [str(x) for x in extra]
    port = free_port()
    env = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120"}
    pre = Node("prefill", port, serve=True, transport=o.transport, extra=extra, env=env)
    dec = Node("decode", port, transport=o.transport, extra=extra, env=env)
    rows = []
    try:
        pre.ready()
        dec.ready()
        room = 1000
        warm = list(range(4))
        for d in (dec,):
            d("receiver", room)
            d("meta", room, pages(warm), 0)
        pre("sender", room)
        pre("wait", room, "WaitingForInput", 60)
        pre("init", room, len(warm), 0)
        pre("send", room, pages(warm))
        dec("wait", room, "Success", 60)
        for n in sizes:
            times = []
            for _ in range(o.repeat):
                room += 1
                span = list(range(n))
                dec("receiver", room)
                dec("meta", room, pages(span), 1)
                pre("sender", room)
                pre("wait", room, "WaitingForInput", 60)
                pre("init", room, n, 1)
                pre("send", room, pages(span))
                got = dec("wait", room, "Success", 120)
                assert got["state"] == "Success", got
                sent = pre("wait", room, "Success", 120)["sent"]
                times.append(got["t"] - sent)
                pre("clear", room)
                dec("clear", room)
            t = statistics.median(times)
            nbytes = n * o.page_kib * 1024 * 2 * o.layers
            floor = memcpy_floor(2 * o.layers, o.page_kib * 1024, n, o.repeat)
            row = {"transport": o.transport, "pages": n, "bytes": nbytes,
                   "ms": round(t * 1e3, 3), "gbps": round(nbytes / t / 1e9, 2),
                   "memcpy_ms": round(floor * 1e3, 3), "ratio": round(floor / t, 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        pre.close()
        dec.close()
    print("\n%-9s %6s %10s %9s %8s %10s %6s" % ("transport", "pages", "MiB", "ms", "GB/s",
                                               "memcpy ms", "ratio"))
    for r in rows:
        print("%-9s %6d %10.1f %9.2f %8.2f %10.2f %6.2f" % (
            r["transport"], r["pages"], r["bytes"] / 2**20, r["ms"], r["gbps"], r["memcpy_ms"],
            r["ratio"]))


if __name__ == "__main__":
    main()
