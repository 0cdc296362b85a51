"""The messages a decode rank sends a prefill rank over SGLang's ZMQ control
socket, and their parsers. Every field from the network is checked here before
the transfer code sees it: a malformed message is refused with a reason, never
half-applied.

  registration   [b"HIXL_REG", JSON]     once per decode rank and prefill rank
  request        [b"HIXL_REQ", JSON, kv]  one per request (bootstrap room)

JSON keeps the messages readable in a capture; the page indices (kv) travel as
raw little-endian int32, as SGLang holds them.
"""
import json
import re

import numpy as np

REG_TAG = b"HIXL_REG"
REQ_TAG = b"HIXL_REQ"
VERSION = 1
# The notification a prefill rank sends with its last write of a request.
NOTIFY_NAME = "sglang.kv"

_U64 = (1 << 64) - 1
_MAX_BUFFERS = 1 << 16
_MAX_ENGINE = 256
_ENGINE_RE = re.compile(r"^[A-Za-z0-9_.:\[\]%-]+$")


class WireError(ValueError):
    """A control message that does not parse or holds impossible values."""


def _int(d, key, lo=0, hi=_U64):
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise WireError("field %r: %r is not an integer in [%d, %d]" % (key, v, lo, hi))
    return v


def _ints(d, key, n=None, lo=0):
    v = d.get(key)
    if not isinstance(v, list) or len(v) > _MAX_BUFFERS:
        raise WireError("field %r is not a list of at most %d integers" % (key, _MAX_BUFFERS))
    if n is not None and len(v) != n:
        raise WireError("field %r has %d entries, expected %d" % (key, len(v), n))
    for x in v:
        if not isinstance(x, int) or isinstance(x, bool) or not lo <= x <= _U64:
            raise WireError("field %r holds %r, not an integer in [%d, 2^64)" % (key, x, lo))
    return v


def _str(d, key, limit=_MAX_ENGINE, pattern=_ENGINE_RE):
    v = d.get(key)
    if not isinstance(v, str) or not 0 < len(v) <= limit or not pattern.match(v):
        raise WireError("field %r: %r is not a valid name" % (key, v))
    return v


def _load(frame):
    try:
        d = json.loads(bytes(frame).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise WireError("not JSON: %s" % e) from None
    if not isinstance(d, dict):
        raise WireError("not a JSON object")
    if d.get("v") != VERSION:
        raise WireError("version %r, this side speaks %d" % (d.get("v"), VERSION))
    return d


def encode_registration(*, engine, rank_ip, rank_port, tp_size, tp_rank, kv_ptrs, kv_lens,
                        kv_item_lens, aux_ptrs, aux_lens, aux_item_lens, page_size):
    d = {"v": VERSION, "engine": engine, "rank_ip": rank_ip, "rank_port": int(rank_port),
         "tp_size": int(tp_size), "tp_rank": int(tp_rank),
         "kv_ptrs": [int(x) for x in kv_ptrs], "kv_lens": [int(x) for x in kv_lens],
         "kv_item_lens": [int(x) for x in kv_item_lens],
         "aux_ptrs": [int(x) for x in aux_ptrs], "aux_lens": [int(x) for x in aux_lens],
         "aux_item_lens": [int(x) for x in aux_item_lens], "page_size": int(page_size)}
    return [REG_TAG, json.dumps(d, separators=(",", ":")).encode()]


class Registration:
    """A decode rank's buffers, as its registration message described them."""

    __slots__ = ("engine", "rank_ip", "rank_port", "tp_size", "tp_rank", "kv_ptrs", "kv_lens",
                 "kv_item_lens", "aux_ptrs", "aux_lens", "aux_item_lens", "page_size",
                 "_pairs", "_kv_pages")

    def kv_pages(self, i):
        return self.kv_lens[i] // self.kv_item_lens[i]

    def aux_rows(self, i):
        return self.aux_lens[i] // self.aux_item_lens[i]


def parse_registration(msg):
    if len(msg) != 2 or msg[0] != REG_TAG:
        raise WireError("a registration is [%r, JSON]" % REG_TAG)
    d = _load(msg[1])
    r = Registration()
    r.engine = _str(d, "engine")
    r.rank_ip = _str(d, "rank_ip")
    r.rank_port = _int(d, "rank_port", 1, 65535)
    r.tp_size = _int(d, "tp_size", 1, 1 << 16)
    r.tp_rank = _int(d, "tp_rank", 0, r.tp_size - 1)
    r.kv_ptrs = _ints(d, "kv_ptrs")
    r.kv_lens = _ints(d, "kv_lens", len(r.kv_ptrs))
    r.kv_item_lens = _ints(d, "kv_item_lens", len(r.kv_ptrs), lo=1)
    r.aux_ptrs = _ints(d, "aux_ptrs")
    r.aux_lens = _ints(d, "aux_lens", len(r.aux_ptrs))
    r.aux_item_lens = _ints(d, "aux_item_lens", len(r.aux_ptrs), lo=1)
    r.page_size = _int(d, "page_size", 1, 1 << 20)
    for ptrs, lens in ((r.kv_ptrs, r.kv_lens), (r.aux_ptrs, r.aux_lens)):
        for p, n in zip(ptrs, lens):
            if p + n > _U64:
                raise WireError("a buffer of %d bytes at 0x%x passes the end of memory" % (n, p))
    return r


def encode_request(*, room, engine, kv_indices, aux_index, required_dst_info_num,
                   decode_prefix_len, is_dummy, rank_ip, rank_port):
    d = {"v": VERSION, "room": int(room), "engine": engine,
         "aux_index": -1 if aux_index is None else int(aux_index),
         "required": int(required_dst_info_num), "prefix": int(decode_prefix_len or 0),
         "dummy": bool(is_dummy), "rank_ip": rank_ip, "rank_port": int(rank_port)}
    kv = b"" if is_dummy else np.ascontiguousarray(kv_indices, dtype="<i4").tobytes()
    return [REQ_TAG, json.dumps(d, separators=(",", ":")).encode(), kv]


class Request:
    """One decode rank's destination for one request (the attribute names SGLang's
    common manager code reads: is_dummy, endpoint, dst_port, required_dst_info_num,
    decode_prefix_len)."""

    __slots__ = ("room", "engine", "kv_indices", "aux_index", "required_dst_info_num",
                 "decode_prefix_len", "is_dummy", "endpoint", "dst_port")


def parse_request(msg):
    if len(msg) != 3 or msg[0] != REQ_TAG:
        raise WireError("a request is [%r, JSON, pages]" % REQ_TAG)
    d = _load(msg[1])
    q = Request()
    q.room = _int(d, "room")
    q.engine = _str(d, "engine")
    q.aux_index = _int(d, "aux_index", -1, 1 << 40)
    q.required_dst_info_num = _int(d, "required", 1, 1 << 16)
    q.decode_prefix_len = _int(d, "prefix", 0, 1 << 40)
    if not isinstance(d.get("dummy"), bool):
        raise WireError("field 'dummy' is not a boolean")
    q.is_dummy = d["dummy"]
    q.endpoint = _str(d, "rank_ip")
    q.dst_port = _int(d, "rank_port", 1, 65535)
    kv = bytes(msg[2])
    if len(kv) % 4:
        raise WireError("the page list is %d bytes, not a whole number of int32" % len(kv))
    q.kv_indices = np.frombuffer(kv, dtype="<i4").astype(np.int64)
    if q.kv_indices.size and q.kv_indices.min() < 0:
        raise WireError("a negative page index")
    if q.is_dummy and q.kv_indices.size:
        raise WireError("a dummy request with pages")
    return q


def encode_done(room, prefill_rank):
    return ("%d:%d" % (room, prefill_rank)).encode()


def parse_done(msg):
    """(room, prefill_rank) of a completion notification, or None."""
    try:
        a, b = bytes(msg).decode("ascii").split(":")
        room, rank = int(a), int(b)
    except (UnicodeDecodeError, ValueError):
        return None
    if not (0 <= room <= _U64 and 0 <= rank < 1 << 20):
        return None
    return room, rank
