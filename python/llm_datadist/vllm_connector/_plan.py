"""Which prefill blocks a decode worker reads, from which prefill worker, and
how many reads each prefill worker waits for. Pure functions of the two
sides' KV layouts (no vLLM, no engine), so every pairing is tested alone.

A layout (describe_kv_caches in _regions) names the per-rank KV heads, the
block size in tokens, the order of heads and tokens inside a block ("HN":
heads outer, "NH": tokens outer, None: not known) and the bytes of one row
(one head's K and V of one token). Two sides with equal layouts and equal
tensor parallelism move whole blocks. Otherwise -- tensor-parallel sizes
that differ (each decode rank reads the heads it holds from the prefill
ranks that hold them), block sizes that differ, or a different order of
heads and tokens -- they move rows: the same memory registered a second time
as rows, so a row of one side lands on the matching row of the other."""


class LayoutError(ValueError):
    """KV tensors this connector cannot describe, or two sides that cannot
    be paired."""


# What must be equal for rows to be paired at all.
_ROW_KEYS = ("layers", "regions", "dtype", "split_kv", "row_bytes", "mla")


def mismatch(mine, theirs, keys=None):
    """'' when the layouts agree on keys (all keys when None), else the
    differing fields, said plainly."""
    keys = sorted(set(mine) | set(theirs)) if keys is None else keys
    return "; ".join("%s: here %r, prefill %r" % (k, mine.get(k), theirs.get(k))
                     for k in keys if mine.get(k) != theirs.get(k))


def readers(q, tp_p, tp_d, h_p, h_d, mla):
    """The decode ranks that read prefill rank q: those holding any of its
    KV heads (MLA: every rank holds the whole latent; decode rank r reads
    prefill rank r mod tp_p)."""
    if mla:
        return [r for r in range(tp_d) if r % tp_p == q]
    return [r for r in range(tp_d) if r * h_d < (q + 1) * h_p and q * h_p < (r + 1) * h_d]


def _row(layout, block, head, tok):
    h, b = layout["heads"], layout["block_tokens"]
    if layout["order"] == "HN":
        return (block * h + head) * b + tok
    return (block * b + tok) * h + head


def releases_only(tp_p, tp_d, r):
    """When nothing is read (the decode request was aborted, or found every
    block locally): each prefill rank is released by exactly one decode rank."""
    return [(q, "release", [], [], 1) for q in range(tp_p) if q % tp_d == r]


def plan(mine, theirs, tp_d, r, tp_p, local, local_start, remote_blocks, window=None):
    """The reads of decode rank r -> [(prefill rank, kind, remote, local, expected)].

    kind: "blocks" (whole blocks: remote and local are block numbers),
    "rows" (remote and local are row numbers) or "release" (no data: the
    prefill rank only learns this rank will not read). expected: how many
    decode ranks the prefill rank hears from for this request. local: the
    decode blocks to fill, holding the tokens from local_start on;
    remote_blocks: every prefill block of the request, from token 0.
    local_start is a multiple of the decode's block size (whole blocks of
    the local prefix cache come first). window: (t0, t1) moves only what
    holds tokens t0 <= t < t1 (whole blocks that hold any of them; the rows
    of exactly those) -- a layer-wise push sends each step's tokens."""
    if not local:
        return releases_only(tp_p, tp_d, r)
    if tp_d == tp_p and mine == theirs:
        b = mine["block_tokens"]
        first = local_start // b
        remote = list(remote_blocks[first:first + len(local)])
        loc = list(local[:len(remote)])
        if window is not None:
            lo = max(0, window[0] // b - first)
            hi = max(lo, -(-window[1] // b) - first)
            remote, loc = remote[lo:hi], loc[lo:hi]
        if not remote:
            return [(r, "release", [], [], 1)]
        return [(r, "blocks", remote, loc, 1)]
    if mine.get("cross_layer") or theirs.get("cross_layer"):
        raise LayoutError("blocks holding every layer (a block-outer KV layout) move only "
                          "between alike instances; these differ: %s"
                          % (mismatch(mine, theirs) or "tensor-parallel sizes: here %d, "
                             "prefill %d" % (tp_d, tp_p)))
    why = mismatch(mine, theirs, _ROW_KEYS)
    if why:
        raise LayoutError("the prefill's KV layout differs from this decode's: " + why)
    if mine["order"] is None or theirs["order"] is None:
        raise LayoutError("the two sides' KV layouts differ (%s) and the heads and tokens of "
                          "a block cannot be told apart (as many heads as tokens per block)"
                          % mismatch(mine, theirs))
    mla = mine["mla"]
    h_d, h_p = mine["heads"], theirs["heads"]
    if not mla and h_d * tp_d != h_p * tp_p:
        raise LayoutError("the decode holds %d KV heads (%d ranks x %d), the prefill %d "
                          "(%d x %d)" % (h_d * tp_d, tp_d, h_d, h_p * tp_p, tp_p, h_p))
    b_d, b_p = mine["block_tokens"], theirs["block_tokens"]
    t_end = min(len(remote_blocks) * b_p, local_start + len(local) * b_d)
    out = []
    for q in range(tp_p):
        rs = readers(q, tp_p, tp_d, h_p, h_d, mla)
        if r not in rs:
            if not rs and q % tp_d == r:
                out.append((q, "release", [], [], 1))
            continue
        heads = [0] if mla else range(max(r * h_d, q * h_p), min((r + 1) * h_d, (q + 1) * h_p))
        t_lo, t_hi = (local_start, t_end) if window is None else \
            (max(local_start, window[0]), min(t_end, window[1]))
        pairs = [(g, t) for g in heads for t in range(t_lo, t_hi)]
        if mine["order"] == "NH" and theirs["order"] == "NH":
            pairs.sort(key=lambda p: (p[1], p[0]))   # tokens outer: rows in runs
        rem, loc = [], []
        for g, t in pairs:
            hp, hd = (0, 0) if mla else (g - q * h_p, g - r * h_d)
            rem.append(_row(theirs, remote_blocks[t // b_p], hp, t % b_p))
            loc.append(_row(mine, local[(t - local_start) // b_d], hd, t % b_d))
        out.append((q, "rows", rem, loc, len(rs)) if rem else (q, "release", [], [], len(rs)))
    return out


# vLLM's null block: a place holder holding no KV (the blocks a sliding
# window dropped, or never needed).
NULL_BLOCK = 0


def plan_groups(mine, theirs, tp_d, r, tp_p, local, local_start, remote, window=None):
    """plan() for blocks that come in KV cache groups (vLLM's hybrid
    allocator: full attention, sliding window, ...): local and remote hold
    one list per group. One group is plan() itself. With several, the groups
    overlay the same memory (a block belongs to one group at a time), so the
    two sides must be alike -- layouts and tensor parallelism -- and whole
    blocks move: each group's blocks from local_start on, paired by
    position, null blocks (tokens a sliding window dropped) skipped. window:
    as in plan()."""
    if len(local) != len(remote):
        raise LayoutError("the prefill's KV cache has %d groups, this decode's %d"
                          % (len(remote), len(local)))
    if len(local) == 1:
        return plan(mine, theirs, tp_d, r, tp_p, local[0], local_start, remote[0], window)
    if not any(local):
        return releases_only(tp_p, tp_d, r)
    if tp_d != tp_p or mine != theirs:
        why = mismatch(mine, theirs) or "tensor-parallel sizes: here %d, prefill %d" % (tp_d,
                                                                                    tp_p)
        raise LayoutError("the KV cache groups of a hybrid model move as whole blocks between "
                          "alike instances; these differ: " + why)
    b = mine["block_tokens"]
    first = local_start // b
    lo, hi = (first, None) if window is None else (window[0] // b, -(-window[1] // b))
    rem, loc = [], []
    for lg, rg in zip(local, remote):
        for i, (b_loc, b_rem) in enumerate(zip(lg, rg[first:first + len(lg)]), first):
            if i < lo or (hi is not None and i >= hi):
                continue
            if b_loc != NULL_BLOCK and b_rem != NULL_BLOCK:
                rem.append(b_rem)
                loc.append(b_loc)
    if not rem:
        return [(r, "release", [], [], 1)]
    return [(r, "blocks", rem, loc, 1)]


def flat(groups):
    """The real (not null) blocks of every group, in one list."""
    return [b for g in groups for b in g if b != NULL_BLOCK]
