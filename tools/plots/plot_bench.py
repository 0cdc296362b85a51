#!/usr/bin/python3
"""Bandwidth against block size from hixl-bench JSON lines, ours beside the
baselines measured in the same run (memcpy, socket pair, the staged "before"
path).

    plot_bench.py OUT.png BENCH.jsonl [MORE.jsonl ...]

One panel per transport; one solid line per (op, threads, batch, mem) of
hixl, dashed lines for the baselines. Uses Debian's python3-matplotlib.
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
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if r.get("mode", "bandwidth") == "bandwidth" and "block_size" in r and "gbps" in r:
                    rows.append(r)
    return rows


def label_size(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    out, paths = sys.argv[1], sys.argv[2:]
    rows = load(paths)
    if not rows:
        sys.exit("plot_bench: no bandwidth rows in " + ", ".join(paths))
    transports = sorted({r["transport"] for r in rows})
    fig, axes = plt.subplots(1, len(transports), figsize=(6.5 * len(transports), 4.6), squeeze=False)
    for ax, tp in zip(axes[0], transports):
        ours = defaultdict(dict)
        base = defaultdict(dict)
        for r in rows:
            if r["transport"] != tp:
                continue
            key = (r.get("op", "write"), r.get("threads", 1), r.get("batch_size", 1), r.get("mem", "alloc"))
            ours[key][r["block_size"]] = r["gbps"]
            if r.get("baseline_gbps") is not None:
                base[(r.get("baseline", "baseline"), r.get("baseline_threads", r.get("threads", 1)))][r["block_size"]] = r["baseline_gbps"]
            if r.get("before_gbps") is not None:
                base[("before (staged socket)", r.get("threads", 1))][r["block_size"]] = r["before_gbps"]
        for (op, th, batch, mem), pts in sorted(ours.items()):
            xs = sorted(pts)
            name = f"hixl {op}, {th} thr" + (f", batch {batch}" if batch != 1 else "") + (f", {mem}" if mem != "alloc" else "")
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=name)
        for (name, th), pts in sorted(base.items()):
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], linestyle="--", marker=".", label=f"{name}, {th} thr")
        ax.set_xscale("log", base=2)
        ticks = sorted({r["block_size"] for r in rows if r["transport"] == tp})
        ax.set_xticks(ticks)
        ax.set_xticklabels([label_size(t) for t in ticks], rotation=45)
        ax.set_xlabel("block size (bytes)")
        ax.set_ylabel("GB/s (10^9 B/s)")
        ax.set_title(f"{tp}: bandwidth by block size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot_bench: wrote {out} ({len(rows)} rows)")


if __name__ == "__main__":
    main()
