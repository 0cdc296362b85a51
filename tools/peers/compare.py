#!/usr/bin/python3
"""Puts hixl-bench rows beside the peer benchmarks' rows of the same run.

    compare.py TABLE.md PLOT.png HIXL.jsonl... -- PEER.jsonl...

Rows are matched on (transport path, op, block size, batch size, threads).
For each hixl row the table gives hixl's GB/s and, per peer configuration
(NIXL over UCX shared memory, NIXL over UCX tcp, Mooncake tcp), the peer's
GB/s and the ratio hixl / peer; the last column is the ratio to the best peer
of that path class. "threads" is hixl's CopyThreads (shm) or TcpLanes (tcp)
and the peers' requests in flight (tools/peers/peer_bench.py). The plot shows
the ratio to the best peer against block size, one panel per path class.
Uses Debian's python3-matplotlib.
"""
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    r = json.loads(line)
                    if r.get("mode", "bandwidth") == "bandwidth" and "gbps" in r:
                        rows.append(r)
    return rows


def key(r):
    return (r["transport"], r["op"], r["block_size"], r.get("batch_size", 1), r.get("threads", 1))


def size(n):
    for unit, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return "%d%s" % (n // m, unit)
    return str(n)


def peer_name(r):
    return "%s %s" % (r["peer"], r.get("peer_path", r["transport"]))


def main(argv):
    if "--" not in argv or len(argv) < 5:
        sys.stderr.write(__doc__)
        return 2
    cut = argv.index("--")
    table_path, plot_path = argv[1], argv[2]
    ours = load(argv[3:cut])
    peers = load(argv[cut + 1:])
    by_key = defaultdict(dict)
    names = []
    for r in peers:
        n = peer_name(r)
        if n not in names:
            names.append(n)
        by_key[key(r)][n] = r["gbps"]
    lines = ["| path | op | block | batch | threads | hixl GB/s | " +
             " | ".join("%s GB/s (hixl ÷)" % n for n in names) + " | hixl ÷ best peer |",
             "| --- | --- | ---: | ---: | ---: | ---: | " + " | ".join("---:" for _ in names) + " | ---: |"]
    plot = defaultdict(list)
    behind = []
    for r in sorted(ours, key=key):
        k = key(r)
        if k not in by_key:
            continue
        cells = []
        best = 0.0
        for n in names:
            g = by_key[k].get(n)
            if g is None:
                cells.append("—")
                continue
            best = max(best, g)
            cells.append("%.3g (%.2f)" % (g, r["gbps"] / g if g > 0 else float("inf")))
        ratio = r["gbps"] / best if best > 0 else float("inf")
        if ratio < 1.2:
            behind.append(k)
        lines.append("| %s | %s | %s | %d | %d | %.3g | %s | **%.2f** |" % (
            k[0], k[1], size(k[2]), k[3], k[4], r["gbps"], " | ".join(cells), ratio))
        plot[(k[0], k[1], k[3], k[4])].append((k[2], ratio))
    lines.append("")
    lines.append("Rows under the goal (hixl ≥ 1.2× the best peer): %d of %d." % (
        len(behind), len(lines) - 3))
    with open(table_path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    paths = sorted({k[0] for k in plot})
    if not paths:
        return 0
    fig, axes = plt.subplots(1, len(paths), figsize=(6 * len(paths), 4), squeeze=False)
    for ax, path in zip(axes[0], paths):
        for (p, op, batch, threads), pts in sorted(plot.items()):
            if p != path:
                continue
            pts.sort()
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o",
                    label="%s batch %d threads %d" % (op, batch, threads))
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.axhline(1.2, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title("%s: hixl ÷ best peer" % path)
        ax.set_xlabel("block size (bytes)")
        ax.set_ylabel("ratio")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(plot_path, dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
