"""Push mode: the prefill writes the prompt's blocks into the decode's.

The decode, once vLLM allocated the request's blocks, writes an *ask* -- its
KV layout, tensor-parallel rank and size, the blocks to fill and the token
they start at -- into pages of its own registered "asks" memory, and tells
each prefill worker holding part of the prompt with a one-block read of that
worker's mailbox, tagged with the transfer id and where the ask lies. The
prefill worker (the tag arrives as an LLM-DataDist event) reads the ask,
checks it, pairs its own blocks of that request with the decode's (_plan,
seen from the decode: the same pairing as a pull) and writes them, tagged
"hvd1"; that event, raised at the decode after the data, says the blocks
are in place. A prefill worker that will not write answers "hvx1" on the
decode's mailbox instead.

What is written is named by the transfer id alone, which the prefill knows
from its own scheduler: a decode can only have the prefill's own blocks of
that request written, and only into the decode's blocks (which the engine
checks at the decode). The decode reuses its blocks only once every asked
prefill worker answered, or after the lease's end plus the prefill's
transfer timeout: a write started before the lease ended has stopped by
then (the engine's deadline; nothing lands later)."""
import json

from . import _common as c

_LAYOUT_INTS = ("layers", "regions", "block_bytes", "heads", "block_tokens", "row_bytes")


class Pages:
    """First-fit runs of the ask pages (callers hold the worker's lock)."""

    def __init__(self, count):
        self._free = [(0, count)]

    def alloc(self, n):
        for i, (start, length) in enumerate(self._free):
            if length >= n:
                if length == n:
                    del self._free[i]
                else:
                    self._free[i] = (start + n, length - n)
                return start
        return None

    def free(self, start, n):
        merged = []
        for s, length in sorted(self._free + [(start, n)]):
            if merged and merged[-1][0] + merged[-1][1] == s:
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((s, length))
        self._free = merged

    def free_pages(self):
        return sum(length for _, length in self._free)


def encode_ask(xid, rank, tp_size, layout, local, local_start, caches=(0, 0)):
    """caches: the ids of this worker's KV cache and of its rows (0: none),
    which a layer-wise write names its destination by."""
    return json.dumps({"v": 1, "xid": xid, "rank": rank, "tp": tp_size, "layout": layout,
                       "local": list(local), "start": local_start, "kv_cache": caches[0],
                       "rows_cache": caches[1]},
                      separators=(",", ":")).encode()


def _count(v, lo, hi):
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def check_layout(layout):
    """A layout from another process, checked field by field (ValueError)."""
    if not isinstance(layout, dict):
        raise ValueError("the layout is not a dict")
    for k in _LAYOUT_INTS:
        if not _count(layout.get(k), 0, 2**40):
            raise ValueError("layout[%r] must be a count, got %r" % (k, layout.get(k)))
    if layout["heads"] < 1 or layout["block_tokens"] < 1:
        raise ValueError("layout: heads and block_tokens must be at least 1")
    if not isinstance(layout.get("dtype"), str):
        raise ValueError("layout[\"dtype\"] must be a string")
    for k in ("split_kv", "mla"):
        if not isinstance(layout.get(k), bool):
            raise ValueError("layout[%r] must be true or false" % k)
    if layout.get("order") not in ("HN", "NH", None):
        raise ValueError("layout[\"order\"] must be \"HN\", \"NH\" or null")
    shape = layout.get("block_shape")
    if not isinstance(shape, list) or not all(_count(d, 0, 2**40) for d in shape):
        raise ValueError("layout[\"block_shape\"] must be a list of sizes")
    return layout


def parse_ask(raw, xid, rank):
    """The ask read from a decode's pages (bytes from another process: every
    field checked) -> dict with tp, layout, local, start; ValueError says
    what is wrong."""
    raw = bytes(raw).split(b"\0", 1)[0]
    try:
        a = json.loads(raw)
    except ValueError as e:
        raise ValueError("the ask is not JSON (%s)" % e) from None
    if not isinstance(a, dict) or a.get("v") != 1:
        raise ValueError("the ask has no version 1")
    if a.get("xid") != xid or a.get("rank") != rank:
        raise ValueError("the ask is for transfer %r of decode rank %r; its tag said %d of %d"
                         % (a.get("xid"), a.get("rank"), xid, rank))
    if not _count(a.get("tp"), 1, 4096) or rank >= a["tp"]:
        raise ValueError("the ask's tensor-parallel size %r does not hold rank %d"
                         % (a.get("tp"), rank))
    if not _count(a.get("start"), 0, 2**40):
        raise ValueError("the ask's first token must be a count")
    local = a.get("local")     # one list of blocks per KV cache group
    if not isinstance(local, list) or not 1 <= len(local) <= 64 or \
            not all(c.block_list(g) for g in local) or not any(local):
        raise ValueError("the ask's blocks must be non-empty lists of block numbers, one per "
                         "KV cache group")
    for k in ("kv_cache", "rows_cache"):
        a.setdefault(k, 0)
        if not _count(a[k], 0, 2**62):
            raise ValueError("the ask's %s must be a cache id" % k)
    check_layout(a.get("layout"))
    return a


class Wait:
    """A decode rank's ask of one request: which prefill ranks were asked,
    their answers (rank -> written?), until when to wait, what to report."""

    __slots__ = ("req_id", "asked", "answers", "deadline", "local", "report", "page", "pages",
                 "errors", "asking")

    def __init__(self, req_id, deadline, local, report, page, pages):
        self.req_id, self.deadline, self.local, self.report = req_id, deadline, local, report
        self.page, self.pages = page, pages
        self.asked, self.answers, self.errors = set(), {}, []
        self.asking = True        # until every rank was asked

    def settled(self, t):
        """True once every asked rank answered, or the deadline passed."""
        if self.asking:
            return False
        return all(q in self.answers for q in self.asked) or t >= self.deadline

    def failure(self):
        """'' when every asked rank wrote its part, else why not."""
        why = list(self.errors)
        missing = sorted(q for q in self.asked if q not in self.answers)
        if missing:
            why.append("prefill rank(s) %s never answered before the lease ended" % missing)
        refused = sorted(q for q, ok in self.answers.items() if not ok)
        if refused:
            why.append("prefill rank(s) %s did not write (see their log)" % refused)
        if not self.asked and not why:
            why.append("no prefill rank could be asked")
        return "; ".join(why)
