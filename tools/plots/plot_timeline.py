#!/usr/bin/python3
"""The demo's per-request timeline: prefill compute per layer (prefill
process) against the KV transfer of that layer (posted to landed), on one
time axis, from `hixl-pd-demo --timeline FILE`.

    plot_timeline.py OUT.png TIMELINE.json

Each request is a row: the upper bar is prefill compute, layer by layer
(alternating shades), below it each layer's transfer (posted to landed, with
a tick at its start), a black tick when the decode process held the whole KV,
and a green bar while it generated the remaining tokens. Uses Debian's python3-matplotlib.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    out, path = sys.argv[1], sys.argv[2]
    with open(path) as f:
        tl = json.load(f)
    reqs = tl["requests"]
    if not reqs:
        sys.exit("plot_timeline: no requests in " + path)
    fig, ax = plt.subplots(figsize=(11, 0.55 * len(reqs) + 1.8))
    shades_c = ["#4C72B0", "#8DA6D0"]
    shades_t = ["#DD8452", "#F0B890"]
    spans = []
    for i, r in enumerate(reqs):
        y = len(reqs) - 1 - i
        for l, layer in enumerate(r["layers"]):
            c0, c1 = layer["compute"]
            t0, t1 = layer["transfer"]
            ax.broken_barh([(c0, max(c1 - c0, 1e-3))], (y + 0.05, 0.4), facecolors=shades_c[l % 2])
            ax.broken_barh([(t0, max(t1 - t0, 0.02))], (y - 0.45, 0.4), facecolors=shades_t[l % 2])
            # A transfer of a few hundred microseconds is narrower than a
            # pixel at this scale: a tick marks each one.
            ax.plot([t0], [y - 0.25], marker="|", markersize=7, color="#C44E00")
            spans.append(t1 - t0)
        ax.plot([r["kv_ready"]], [y], marker="|", markersize=14, color="black")
        # The decode process: from holding the KV to the last token.
        ax.broken_barh([(r["kv_ready"], max(r["end"] - r["kv_ready"], 1e-3))], (y - 0.45, 0.15),
                       facecolors="#55A868")
    ax.set_yticks(range(len(reqs)))
    ax.set_yticklabels([f"req {r['request']} ({r['prompt']} tok)" for r in reversed(reqs)])
    ax.set_xlabel("ms since the first request's prefill began")
    spans.sort()
    median = spans[len(spans) // 2] if spans else 0.0
    ax.set_title(f"{tl['run']}: prefill process: compute per layer (blue), that layer's KV transfer (orange);\n"
                 f"decode process: | holds the whole KV, then generates (green); median layer transfer {median:.3f} ms",
                 fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"plot_timeline: wrote {out} ({len(reqs)} requests, {tl['layers']} layers)")


if __name__ == "__main__":
    main()
