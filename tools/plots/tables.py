#!/usr/bin/python3
"""Markdown tables from the JSON lines of hixl-bench (sweeps, --stream,
--notify), hixl-bench --many and hixl-kv-bench (any mix of files), for
docs/PERFORMANCE.md.

    tables.py FILE.jsonl [MORE.jsonl ...] > tables.md
"""
import json
import sys
from collections import defaultdict


def size(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def rows_of(paths):
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    r["_file"] = path
                    yield r


def sweep(rows):
    """One table per (transport, mem, threads): block size x op, ours / baseline."""
    groups = defaultdict(list)
    for r in rows:
        # Runs from different files (e.g. the sweep and the user-memory run) stay apart.
        groups[(r["_file"], r["transport"], r.get("mem", "alloc"), r.get("threads", 1),
                r.get("batch_size", 1))].append(r)
    out = []
    for (_, tp, mem, th, batch), rs in sorted(groups.items()):
        base = rs[0].get("baseline", "baseline")
        before = any("before_gbps" in r for r in rs)
        out.append(f"\n**{tp}, {mem} memory, {th} thread{'s' if th != 1 else ''}"
                   f"{', batch ' + str(batch) if batch != 1 else ''}** (baseline: {base}"
                   f"{'; before = staged socket path' if before else ''})\n")
        cma = any("cma_gbps" in r for r in rs)
        hdr = ("| block | op | GB/s | p50 µs | baseline GB/s | ratio |" + (" before GB/s | vs before |" if before else "")
               + (" bare cma GB/s | × cma |" if cma else ""))
        out.append(hdr)
        out.append("|" + "---|" * (hdr.count("|") - 1))
        for r in sorted(rs, key=lambda r: (r["op"], r["block_size"])):
            line = (f"| {size(r['block_size'])} | {r['op']} | {r['gbps']:.2f} | {r.get('p50_us', 0):.1f} | "
                    f"{r.get('baseline_gbps', 0):.2f} | {r.get('ratio', 0):.2f} |")
            if before:
                line += f" {r.get('before_gbps', 0):.2f} | {r.get('before_ratio', 0):.2f} |"
            if cma:
                line += f" {r.get('cma_gbps', 0):.2f} | {r.get('cma_ratio', 0):.2f} |"
            out.append(line)
    return out


def many(rows):
    out = ["\n| link | op | initiators | block | aggregate GB/s | per-initiator min / max GB/s | Jain | baseline GB/s | ratio |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["transport"], r.get("op", ""), r.get("initiators", 0), r["block_size"])):
        out.append(f"| {r['transport']} | {r.get('op')} | {r.get('initiators')} | {size(r['block_size'])} | "
                   f"{r['gbps']:.2f} | {r.get('min_gbps', 0):.2f} / {r.get('max_gbps', 0):.2f} | "
                   f"{r.get('jain', 0):.3f} | {r.get('baseline_gbps', 0):.2f} | {r.get('ratio', 0):.2f} |")
    return out


def stream(rows):
    """--stream rows: async transfers per second beside ucx_perftest's."""
    out = ["\n| link | memory | op | block | window | threads | M transfers/s | µs each | p50 µs (sampled) | "
           "perftest M/s | ratio | CPU ms per 10^4 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["transport"], r.get("mem", ""), r["op"], r["block_size"], r.get("threads", 1))):
        base = f"{r['baseline_tps'] / 1e6:.2f}" if "baseline_tps" in r else "-"
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        out.append(f"| {r['transport']} | {r.get('mem', 'alloc')} | {r['op']} | {size(r['block_size'])} | "
                   f"{r.get('window', 0)} | {r.get('threads', 1)} | {r.get('tps', 0) / 1e6:.2f} | "
                   f"{r.get('avg_us', 0):.3f} | {r.get('p50_us', 0):.1f} | {base} | {ratio} | "
                   f"{r.get('cpu_ms_per_10k', 0):.2f} |")
    return out


def notify(rows):
    """--notify rows: post -> seen by the target application, beside a plain WRITE."""
    out = ["\n| link | engine options | target waits by | gap µs | seen p50 µs | seen p99 µs | "
           "WRITE+notify sync p50 µs | plain WRITE p50 µs |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['transport']} | {r.get('engine_opts') or '-'} | {r.get('target', 'callback')} | "
                   f"{r.get('gap_us', 0)} | {r['seen_p50_us']:.2f} | {r['seen_p99_us']:.2f} | "
                   f"{r['sync_notify_p50_us']:.2f} | {r['write_p50_us']:.2f} |")
    return out


def kv(rows):
    out = ["\n| link | cache | op | blocks | table | MB | GB/s | engine batched GB/s | ratio | build ms |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['transport']} | {r['cache']} | {r['op']} | {r['blocks']} | {r['table']} | "
                   f"{r['bytes'] / 1e6:.1f} | {r['gbps']:.2f} | {r['baseline_gbps']:.2f} | {r['ratio']:.2f} | "
                   f"{r['build_ms']:.3f} |")
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = list(rows_of(sys.argv[1:]))
    bw = [r for r in rows if r.get("mode") == "bandwidth" and "initiators" not in r and r.get("bench") != "kv"]
    mn = [r for r in rows if "initiators" in r]
    kvr = [r for r in rows if r.get("bench") == "kv"]
    st = [r for r in rows if r.get("mode") == "stream"]
    nt = [r for r in rows if r.get("mode") == "notify"]
    lines = []
    if bw:
        lines += sweep(bw)
    if st:
        lines += stream(st)
    if nt:
        lines += notify(nt)
    if mn:
        lines += many(mn)
    if kvr:
        lines += kv(kvr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
