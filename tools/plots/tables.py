#!/usr/bin/python3
"""Markdown tables from the JSON lines of hixl-bench, hixl-bench --many and
hixl-kv-bench (any mix of files), for docs/PERFORMANCE.md.

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
                    yield json.loads(line)


def sweep(rows):
    """One table per (transport, mem, threads): block size x op, ours / baseline."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["transport"], r.get("mem", "alloc"), r.get("threads", 1), r.get("batch_size", 1))].append(r)
    out = []
    for (tp, mem, th, batch), rs in sorted(groups.items()):
        base = rs[0].get("baseline", "baseline")
        before = any("before_gbps" in r for r in rs)
        out.append(f"\n**{tp}, {mem} memory, {th} thread{'s' if th != 1 else ''}"
                   f"{', batch ' + str(batch) if batch != 1 else ''}** (baseline: {base}"
                   f"{'; before = staged socket path' if before else ''})\n")
        hdr = "| block | op | GB/s | p50 µs | baseline GB/s | ratio |" + (" before GB/s | vs before |" if before else "")
        out.append(hdr)
        out.append("|" + "---|" * (hdr.count("|") - 1))
        for r in sorted(rs, key=lambda r: (r["op"], r["block_size"])):
            line = (f"| {size(r['block_size'])} | {r['op']} | {r['gbps']:.2f} | {r.get('p50_us', 0):.1f} | "
                    f"{r.get('baseline_gbps', 0):.2f} | {r.get('ratio', 0):.2f} |")
            if before:
                line += f" {r.get('before_gbps', 0):.2f} | {r.get('before_ratio', 0):.2f} |"
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
    lines = []
    if bw:
        lines += sweep(bw)
    if mn:
        lines += many(mn)
    if kvr:
        lines += kv(kvr)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
