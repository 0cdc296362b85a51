"""llm_datadist._facade: KVCachePublisher / KVCacheSubscriber, a small
publish/subscribe API over LLMDataDist for handing one prompt's KV cache
from a prefill process to a decode process.

How the two sides find each other and where the bytes go
---------------------------------------------------------
* The subscriber (decode side) listens on local_ip:local_port (port 0: a
  free one, see .local_port) with cluster id ``rank_id`` (or ``cluster_id=``).
  It registers two paged caches: the receive buffer given to
  register_buffer (blocks of ``block_size`` bytes, found by peers through
  BlocksCacheKey(cluster, RECV_MODEL_ID)) and a two-block control cache
  (CTRL_MODEL_ID): block 0 is a header the subscriber keeps up to date
  (magic, block size, block count, one row per publisher), block 1 is a
  scratch block publishers write messages into.
* The publisher (prefill side) is told the subscriber's ip, port and rank:
  connect() links to it, reads the header (a pull of control block 0), and
  claims a region of the receive buffer (default: all of it) by a push into
  the scratch block whose user_tag says so. The subscriber sees that push as a
  KvTransferEvent, accepts the claim unless it overlaps the region of another
  publisher, and writes the verdict into its header row; connect() polls the
  header for it. Give each of several publishers a distinct ``region=``.
* publish(cache_id, data) pushes the bytes into the next free blocks of the
  publisher's region (a ring: a publication never straddles the region's end),
  with a user_tag naming the CacheId, the blocks, the byte count and the
  CacheDescriptor. The engine delivers the subscriber's KvTransferEvent after
  the data is in place, so subscribe(cache_id) returns as soon as the bytes
  can be read; get_cache_data(cache_id) is a view of them in the registered
  buffer (no copy). Whole blocks move straight from ``data`` (registered for
  the duration of the call, no copy); only a last partial block is staged
  through a one-block buffer.
* Space: a publication stays in the buffer until the subscriber calls
  release(cache_id) (or a publication of the same CacheId replaces it). The
  header row carries how far the publisher's ring is released; publish()
  waits up to timeout_ms for room and then raises LLMException
  (LLM_OUT_OF_MEMORY) -- nothing unreleased is ever overwritten by a
  publisher that keeps to its region.
* notify_not_found(cache_id) tells the subscriber the publisher has no such
  cache: subscribe() then returns SUBSCRIBE_STATUS_NOT_FOUND.
"""
import json
import math
import secrets
import struct
import threading
import time

from . import _core
from ._core import (BlocksCacheKey, CacheDesc, DataType, LLMClusterInfo, LLMConfig, LLMDataDist,
                    LLMException, LLMRole, LLMStatusCode, Placement, TransferEventKind, _int,
                    _param)
from . import _llm_datadist as _C

SUBSCRIBE_STATUS_SUCCESS = 0
SUBSCRIBE_STATUS_TIMEOUT = 1
SUBSCRIBE_STATUS_NOT_FOUND = 2
SUBSCRIBE_STATUS_FAILED = 3
_STATUS_NAMES = {0: "SUCCESS", 1: "TIMEOUT", 2: "NOT_FOUND", 3: "FAILED"}

RECV_MODEL_ID = 0x6C64642D72656376   # "ldd-recv": the subscriber's receive buffer
CTRL_MODEL_ID = 0x6C64642D6374726C   # "ldd-ctrl": its control cache
PUBLISHER_CLUSTER_BASE = 1 << 32     # a publisher's default cluster id: BASE | rank_id

_CTRL_BLOCK = 4096
_MAGIC = 0x3130425553444C4C          # "LLDSUB01"
_CHECK = 0x9E3779B97F4A7C15
_HDR_WORDS = 8                       # magic, version, block_size, num_blocks, rows, 0, 0, check
_ROW_WORDS = 8                       # cluster, writer, first, count, released, status, other, check
_MAX_ROWS = (_CTRL_BLOCK // 8 - _HDR_WORDS) // _ROW_WORDS
_TAG = "ldd1 "
_MAX_TAG = 256

_ROW_ACCEPTED, _ROW_OVERLAP, _ROW_BAD_REGION = 1, 2, 3
_MAX_REMEMBERED = 4096               # NOT_FOUND / overwritten CacheIds kept for subscribe


def _xor(ws):
    x = _CHECK
    for w in ws:
        x ^= w
    return x


# --------------------------------------------------------------------- small types

_NP_NAMES = {"float32": DataType.DT_FLOAT, "float": DataType.DT_FLOAT,
             "float16": DataType.DT_FLOAT16, "half": DataType.DT_FLOAT16,
             "bfloat16": DataType.DT_BF16, "int8": DataType.DT_INT8, "int16": DataType.DT_INT16,
             "int32": DataType.DT_INT32, "int64": DataType.DT_INT64, "uint8": DataType.DT_UINT8,
             "uint16": DataType.DT_UINT16, "uint32": DataType.DT_UINT32,
             "uint64": DataType.DT_UINT64, "float64": DataType.DT_DOUBLE,
             "double": DataType.DT_DOUBLE, "bool": DataType.DT_BOOL}


def _dtype(d):
    if isinstance(d, DataType):
        return d
    if isinstance(d, int) and not isinstance(d, bool):
        return _core._enum(DataType, d, "dtype")
    name = d.__name__ if isinstance(d, type) else str(d)   # numpy.uint8, np.dtype("uint8")
    if name.startswith("torch."):
        name = name[6:]
    if name.startswith("DT_") and name in DataType.__members__:
        return DataType[name]
    if name in _NP_NAMES:
        return _NP_NAMES[name]
    raise _param("dtype %r is not a DataType, numpy or torch dtype" % (d,))


def _location(loc):
    if isinstance(loc, str):
        s = loc.lower()
        if s in ("host", "cpu"):
            return Placement.HOST
        if s == "device":
            return Placement.DEVICE
        raise _param("location must be a Placement, \"host\" or \"device\"")
    return _core._enum(Placement, loc, "location")


class CacheDescriptor:
    """What a published KV cache is: shape, dtype (a DataType; numpy/torch
    dtypes and their names are accepted) and location (a Placement)."""

    def __init__(self, shape, dtype=DataType.DT_UINT8, location=Placement.HOST):
        self.shape = tuple(_int(d, "shape dim", 0, (1 << 62)) for d in shape)
        self.dtype = _dtype(dtype)
        self.location = _location(location)

    @property
    def nbytes(self):
        return math.prod(self.shape) * _C.data_type_size(int(self.dtype))

    def _wire(self):
        return [list(self.shape), int(self.dtype), int(self.location)]

    @classmethod
    def _from_wire(cls, w):
        return cls(w[0], w[1], w[2])

    def __eq__(self, o):
        return isinstance(o, CacheDescriptor) and (self.shape, self.dtype, self.location) == \
            (o.shape, o.dtype, o.location)

    def __repr__(self):
        return "CacheDescriptor(shape=%r, dtype=%s, location=%s)" % (
            self.shape, self.dtype.name, self.location.name)


class CacheId:
    """Names one prompt's KV cache: prompt_hash (str) and seq_len (tokens)."""

    __slots__ = ("prompt_hash", "seq_len")

    def __init__(self, prompt_hash, seq_len):
        if not isinstance(prompt_hash, str) or not prompt_hash:
            raise _param("prompt_hash must be a non-empty str")
        object.__setattr__(self, "prompt_hash", prompt_hash)
        object.__setattr__(self, "seq_len", _int(seq_len, "seq_len", 0, (1 << 62)))

    def __setattr__(self, k, v):
        raise AttributeError("CacheId is immutable")

    def _key(self):
        return (self.prompt_hash, self.seq_len)

    def __eq__(self, o):
        return isinstance(o, CacheId) and o._key() == self._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return "CacheId(prompt_hash=%r, seq_len=%d)" % self._key()


class SubscribeResult:
    """subscribe()'s answer: status (SUBSCRIBE_STATUS_*), cache_id, seq_len,
    size (bytes received), descriptor (a CacheDescriptor or None) and message."""

    def __init__(self, status, cache_id, size=0, descriptor=None, message=""):
        self.status = status
        self.cache_id = cache_id
        self.seq_len = cache_id.seq_len
        self.size = size
        self.descriptor = descriptor
        self.message = message

    def __repr__(self):
        return "SubscribeResult(status=%s, %r, size=%d, %s)" % (
            _STATUS_NAMES.get(self.status, self.status), self.cache_id, self.size,
            self.message or self.descriptor)


def _remember(d, key, msg):
    d.pop(key, None)
    d[key] = msg
    while len(d) > _MAX_REMEMBERED:
        del d[next(iter(d))]


def _cache_id(c):
    if not isinstance(c, CacheId):
        raise _param("cache_id must be a CacheId")
    return c


def _port_of(address):
    host, _, port = address.rpartition(":")
    return int(port) if port.isdigit() else 0


def _make(role, cluster_id, local_ip, local_port, global_resource_config):
    dd = LLMDataDist(role, cluster_id)
    cfg = LLMConfig()
    if local_port is not None:
        cfg.listen_ip_info = "%s:%d" % (local_ip, _int(local_port, "local_port", 0, 65535))
    if global_resource_config is not None:
        cfg.global_resource_config = global_resource_config
    dd.init(cfg.generate_options())
    return dd


# --------------------------------------------------------------------- subscriber

class _Entry:
    __slots__ = ("cluster", "writer", "vpos", "first", "blocks", "nbytes", "descriptor")

    def __init__(self, cluster, writer, vpos, first, blocks, nbytes, descriptor):
        self.cluster, self.writer, self.vpos, self.first = cluster, writer, vpos, first
        self.blocks, self.nbytes, self.descriptor = blocks, nbytes, descriptor


class _Claim:
    __slots__ = ("row", "writer", "first", "count", "status", "end", "other")

    def __init__(self, row):
        self.row = row
        self.writer = self.first = self.count = self.status = self.end = self.other = 0


class KVCacheSubscriber:
    """The decode side: init(rank_id, local_ip, local_port), register_buffer,
    subscribe(cache_id, timeout_ms) -> SubscribeResult, get_cache_data,
    release, finalize. See the module docstring for the protocol."""

    def __init__(self):
        self._dd = None
        self._cv = threading.Condition()
        self._buf = None
        self._buf_addr = 0
        self._block = 0
        self._nblocks = 0
        self._recv = None
        self._entries = {}     # CacheId key -> _Entry
        self._not_found = {}   # CacheId key -> message
        self._lost = {}        # CacheId key -> message (overwritten)
        self._claims = {}      # publisher cluster id -> _Claim (rows never freed)
        self._closed = False
        self.rank_id = self.cluster_id = self.local_ip = self.local_port = None

    # -- setup
    def init(self, rank_id=0, local_ip="127.0.0.1", local_port=0, *, cluster_id=None,
             global_resource_config=None):
        """Starts listening on local_ip:local_port (0: a free port, see
        .local_port) as cluster ``cluster_id`` (default: rank_id)."""
        if self._dd is not None:
            raise LLMException("LLM_FAILED: the subscriber is initialized", LLMStatusCode.LLM_FAILED)
        self.rank_id = _int(rank_id, "rank_id")
        self.cluster_id = self.rank_id if cluster_id is None else _int(cluster_id, "cluster_id")
        dd = _make(LLMRole.DECODER, self.cluster_id, local_ip, local_port, global_resource_config)
        try:
            cm = dd.cache_manager
            self._ctrl = cm.allocate_host_memory(2 * _CTRL_BLOCK)
            self._hdr = memoryview(self._ctrl)
            self._write_header()
            cm.set_transfer_callback(self._on_event)
            self._ctrl_cache = cm.register_blocks_cache(
                CacheDesc(1, [2, _CTRL_BLOCK], DataType.DT_UINT8, Placement.HOST), [self._ctrl],
                BlocksCacheKey(self.cluster_id, CTRL_MODEL_ID))
        except BaseException:
            dd.finalize()
            raise
        self._dd = dd
        self.local_ip = local_ip
        self.local_port = _port_of(dd.local_address)

    @property
    def datadist(self):
        """The LLMDataDist underneath (for links, events, other caches)."""
        return self._dd

    def allocate_host_memory(self, size):
        """Host memory of this subscriber's own instance (peers on this host
        map it directly); freed when unreferenced or at finalize."""
        self._check()
        return self._dd.cache_manager.allocate_host_memory(size)

    def register_buffer(self, buffer, block_size=4096):
        """Registers the receive buffer (HostMemory, numpy array, CPU tensor or
        any writable buffer; no copy) as blocks of block_size bytes. Once."""
        self._check()
        if self._buf is not None:
            raise _param("a receive buffer is registered already")
        block_size = _int(block_size, "block_size", 1, 1 << 30)
        addr, size = _C.address_of(buffer, True)
        if size is None:
            raise _param("register_buffer needs a sized object (not a bare address)")
        n = size // block_size
        if n == 0:
            raise _param("the buffer (%d bytes) is smaller than one block (%d)" % (size, block_size))
        desc = CacheDesc(1, [n, block_size], DataType.DT_UINT8, Placement.HOST)
        # Registered outside the lock (the event thread takes it); publishers
        # only push after the header below shows the buffer.
        recv = self._dd.cache_manager.register_blocks_cache(
            desc, [buffer], BlocksCacheKey(self.cluster_id, RECV_MODEL_ID))
        with self._cv:
            self._recv = recv
            self._buf, self._buf_addr, self._block, self._nblocks = buffer, addr, block_size, n
            self._write_header()

    # -- header (control block 0)
    def _write_header(self):
        words = [_MAGIC, 1, self._block, self._nblocks, len(self._claims), 0, 0]
        struct.pack_into("<7Q", self._hdr, 0, *words)
        struct.pack_into("<Q", self._hdr, 56, _xor(words))

    def _write_row(self, c, cluster):
        released = self._released(cluster, c)
        words = [cluster, c.writer, c.first, c.count, released, c.status, c.other]
        off = (_HDR_WORDS + c.row * _ROW_WORDS) * 8
        struct.pack_into("<Q", self._hdr, off + 56, 0)
        struct.pack_into("<7Q", self._hdr, off, *words)
        struct.pack_into("<Q", self._hdr, off + 56, _xor(words))

    def _released(self, cluster, c):
        vs = [e.vpos for e in self._entries.values()
              if e.cluster == cluster and e.writer == c.writer]
        return min(vs) if vs else c.end

    # -- events (an instance thread, GIL held)
    def _on_event(self, ev):
        if ev.kind != TransferEventKind.PUSHED or not ev.user_tag.startswith(_TAG):
            return
        try:
            msg = json.loads(ev.user_tag[len(_TAG):])
            t = msg["t"]
        except (ValueError, KeyError, TypeError):
            return
        with self._cv:
            if self._closed:
                return
            if t == "pub" and self._recv is not None and ev.cache_id == self._recv.cache_id:
                self._on_publication(ev.peer_cluster_id, msg)
            elif ev.cache_id == self._ctrl_cache.cache_id:
                if t == "claim":
                    self._on_claim(ev.peer_cluster_id, msg)
                elif t == "nf":
                    key = (str(msg["h"]), int(msg["s"]))
                    if key not in self._entries:
                        _remember(self._not_found, key, "the publisher has no such cache")
                elif t == "bye":
                    c = self._claims.get(ev.peer_cluster_id)
                    if c is not None and c.writer == int(msg["w"]):
                        c.status = 0
                        c.count = 0
                        self._write_row(c, ev.peer_cluster_id)
            self._cv.notify_all()

    def _on_claim(self, cluster, msg):
        writer, first, count = int(msg["w"]), int(msg["f"]), int(msg["n"])
        c = self._claims.get(cluster)
        if c is None:
            if len(self._claims) >= _MAX_ROWS:
                return  # no row to answer in: the publisher's connect times out
            c = self._claims[cluster] = _Claim(len(self._claims))
        c.writer, c.first, c.count, c.end, c.other = writer, first, count, 0, 0
        if count <= 0 or first < 0 or first + count > self._nblocks:
            c.status = _ROW_BAD_REGION
        else:
            c.status = _ROW_ACCEPTED
            for other, o in self._claims.items():
                if other != cluster and o.status == _ROW_ACCEPTED and \
                        first < o.first + o.count and o.first < first + count:
                    c.status, c.other = _ROW_OVERLAP, other
                    break
        self._write_row(c, cluster)
        self._write_header()

    def _on_publication(self, cluster, msg):
        c = self._claims.get(cluster)
        writer = int(msg["w"])
        if c is None or c.status != _ROW_ACCEPTED or c.writer != writer:
            return
        vpos, first, blocks, nbytes = int(msg["v"]), int(msg["o"]), int(msg["b"]), int(msg["n"])
        if first < c.first or first + blocks > c.first + c.count or nbytes > blocks * self._block:
            return
        key = (str(msg["h"]), int(msg["s"]))
        desc = CacheDescriptor._from_wire(msg["d"]) if msg.get("d") else None
        # Whatever these blocks held before is gone.
        for k, e in list(self._entries.items()):
            if k != key and first < e.first + e.blocks and e.first < first + blocks:
                del self._entries[k]
                _remember(self._lost, k, "overwritten by a later publication")
        self._entries[key] = _Entry(cluster, writer, vpos, first, blocks, nbytes, desc)
        self._not_found.pop(key, None)
        self._lost.pop(key, None)
        c.end = max(c.end, vpos + blocks)
        self._write_row(c, cluster)

    # -- the API
    def subscribe(self, cache_id, timeout_ms=5000):
        """Waits up to timeout_ms for cache_id to arrive: a SubscribeResult
        with status SUBSCRIBE_STATUS_SUCCESS (the bytes are readable now),
        _TIMEOUT, _NOT_FOUND (the publisher said it has none) or _FAILED (no
        buffer registered, closed, or the data was overwritten)."""
        cid = _cache_id(cache_id)
        key = cid._key()
        deadline = time.monotonic() + _int(timeout_ms, "timeout_ms", 0, 1 << 31) / 1000.0
        with self._cv:
            while True:
                if self._closed or self._dd is None:
                    return SubscribeResult(SUBSCRIBE_STATUS_FAILED, cid, message="not initialized")
                if self._buf is None:
                    return SubscribeResult(SUBSCRIBE_STATUS_FAILED, cid,
                                           message="no receive buffer registered")
                e = self._entries.get(key)
                if e is not None:
                    return SubscribeResult(SUBSCRIBE_STATUS_SUCCESS, cid, e.nbytes, e.descriptor)
                if key in self._not_found:
                    return SubscribeResult(SUBSCRIBE_STATUS_NOT_FOUND, cid,
                                           message=self._not_found[key])
                if key in self._lost:
                    return SubscribeResult(SUBSCRIBE_STATUS_FAILED, cid, message=self._lost[key])
                left = deadline - time.monotonic()
                if left <= 0:
                    return SubscribeResult(SUBSCRIBE_STATUS_TIMEOUT, cid,
                                           message="nothing arrived in %d ms" % timeout_ms)
                self._cv.wait(left)

    def get_cache_data(self, cache_id):
        """The received bytes of cache_id in the registered buffer: a
        HostMemory view (buffer protocol, .address, .size; no copy), valid
        until release(cache_id)."""
        key = _cache_id(cache_id)._key()
        with self._cv:
            e = self._entries.get(key)
            if e is None:
                raise LLMException("LLM_KV_CACHE_NOT_EXIST: %r has not arrived" % (cache_id,),
                                   LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
            return _C.view(self._buf_addr + e.first * self._block, e.nbytes, self._buf)

    def release(self, cache_id):
        """Gives cache_id's blocks back to its publisher (views from
        get_cache_data must not be used afterwards)."""
        key = _cache_id(cache_id)._key()
        with self._cv:
            e = self._entries.pop(key, None)
            if e is None:
                raise LLMException("LLM_KV_CACHE_NOT_EXIST: %r is not held" % (cache_id,),
                                   LLMStatusCode.LLM_KV_CACHE_NOT_EXIST)
            c = self._claims.get(e.cluster)
            if c is not None:
                self._write_row(c, e.cluster)

    def cached(self):
        """The CacheIds received and not released."""
        with self._cv:
            return [CacheId(h, s) for h, s in self._entries]

    def finalize(self):
        """Stops the subscriber (its memory is released: drop views first)."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if self._dd is not None:
            self._dd.finalize()

    close = finalize

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False

    def _check(self):
        if self._dd is None or self._closed:
            raise LLMException("LLM_FAILED: the subscriber is not initialized",
                               LLMStatusCode.LLM_FAILED)


# --------------------------------------------------------------------- publisher

class _Sub:
    __slots__ = ("cluster", "block", "first", "count", "writer", "head", "released", "tail",
                 "tail_cache")


class KVCachePublisher:
    """The prefill side: init(rank_id), connect(subscriber ip, port, rank),
    publish(cache_id, data), notify_not_found, disconnect, finalize. See the
    module docstring for the protocol."""

    def __init__(self):
        self._dd = None
        self._subs = {}
        self._lock = threading.RLock()
        self._stage = None
        self.rank_id = self.cluster_id = self.local_ip = None

    def init(self, rank_id=0, local_ip="127.0.0.1", local_port=None, *, cluster_id=None,
             global_resource_config=None):
        """Starts the publisher as cluster ``cluster_id`` (default:
        PUBLISHER_CLUSTER_BASE | rank_id). It only links out unless
        local_port is given."""
        if self._dd is not None:
            raise LLMException("LLM_FAILED: the publisher is initialized", LLMStatusCode.LLM_FAILED)
        self.rank_id = _int(rank_id, "rank_id", 0, PUBLISHER_CLUSTER_BASE - 1)
        self.cluster_id = (PUBLISHER_CLUSTER_BASE | self.rank_id) if cluster_id is None else \
            _int(cluster_id, "cluster_id")
        self.local_ip = local_ip
        dd = _make(LLMRole.PROMPT, self.cluster_id, local_ip, local_port, global_resource_config)
        try:
            cm = dd.cache_manager
            self._stage = cm.allocate_host_memory(2 * _CTRL_BLOCK)  # 0: messages, 1: header
            self._stage_cache = cm.register_blocks_cache(
                CacheDesc(1, [2, _CTRL_BLOCK], DataType.DT_UINT8, Placement.HOST), [self._stage])
        except BaseException:
            dd.finalize()
            raise
        self._dd = dd

    @property
    def datadist(self):
        return self._dd

    def _check(self):
        if self._dd is None:
            raise LLMException("LLM_FAILED: the publisher is not initialized",
                               LLMStatusCode.LLM_FAILED)

    def _sub(self, subscriber):
        if subscriber is None:
            if len(self._subs) != 1:
                raise _param("connected to %d subscribers: say which (subscriber=)" %
                             len(self._subs))
            return next(iter(self._subs.values()))
        s = self._subs.get(subscriber)
        if s is None:
            raise LLMException("LLM_NOT_YET_LINK: not connected to subscriber %r" % (subscriber,),
                               LLMStatusCode.LLM_NOT_YET_LINK)
        return s

    # -- control messages
    def _read_header(self, cluster, deadline):
        """Pulls the subscriber's header -> (block_size, num_blocks, rows)."""
        cm = self._dd.cache_manager
        while True:
            try:
                cm.pull_blocks(BlocksCacheKey(cluster, CTRL_MODEL_ID), self._stage_cache, [0], [1],
                               tensor_num_per_layer=1)
                mv = memoryview(self._stage)[_CTRL_BLOCK:]
                h = struct.unpack_from("<8Q", mv, 0)
                if h[0] == _MAGIC and h[7] == _xor(h[:7]):
                    rows = []
                    ok = True
                    for r in range(min(h[4], _MAX_ROWS)):
                        w = struct.unpack_from("<8Q", mv, (_HDR_WORDS + r * _ROW_WORDS) * 8)
                        if w[7] != _xor(w[:7]):
                            ok = False
                            break
                        rows.append(w)
                    if ok:
                        return h[2], h[3], rows
            except LLMException as e:
                # Not registered yet, or the subscriber's cache table was just
                # republished and its new region has not reached our engine yet.
                transient = e.status_code == LLMStatusCode.LLM_KV_CACHE_NOT_EXIST or (
                    e.status_code == LLMStatusCode.LLM_PARAM_INVALID and
                    "reading the cache table" in str(e))
                if not transient or time.monotonic() >= deadline:
                    raise
            if time.monotonic() >= deadline:
                raise LLMException("LLM_TIMEOUT: no consistent header from subscriber %d" % cluster,
                                   LLMStatusCode.LLM_TIMEOUT)
            time.sleep(0.001)

    def _message(self, cluster, msg):
        tag = _TAG + json.dumps(msg, separators=(",", ":"))
        if len(tag.encode()) > _MAX_TAG:
            raise _param("the message for %r is too long (prompt_hash?)" % (msg.get("h"),))
        self._dd.cache_manager.push_blocks(BlocksCacheKey(cluster, CTRL_MODEL_ID),
                                           self._stage_cache, [0], [1], user_tag=tag,
                                           tensor_num_per_layer=1)

    # -- the API
    def connect(self, remote_ip, remote_port, remote_rank_id=0, *, remote_cluster_id=None,
                region=None, timeout_ms=5000):
        """Links to the subscriber at remote_ip:remote_port (cluster
        remote_cluster_id, default remote_rank_id), waiting up to timeout_ms
        for it to listen and register its buffer, and claims region=(offset,
        size) bytes of that buffer (block-aligned; default all of it). Returns
        the subscriber's cluster id (the subscriber= of publish)."""
        self._check()
        cluster = remote_rank_id if remote_cluster_id is None else remote_cluster_id
        cluster = _int(cluster, "remote_cluster_id")
        deadline = time.monotonic() + _int(timeout_ms, "timeout_ms", 0, 1 << 31) / 1000.0
        with self._lock:
            if cluster in self._subs:
                raise LLMException("LLM_ALREADY_LINK: connected to subscriber %d" % cluster,
                                   LLMStatusCode.LLM_ALREADY_LINK)
            info = LLMClusterInfo()
            info.remote_cluster_id = cluster
            info.remote_role_type = LLMRole.DECODER
            info.append_local_ip_info(self.local_ip, 0)
            info.append_remote_ip_info(remote_ip, _int(remote_port, "remote_port", 1, 65535))
            while True:  # the subscriber may still be starting
                left = max(1, int((deadline - time.monotonic()) * 1000))
                _, rets = self._dd.link_clusters([info], timeout=left)
                if rets[0] in (LLMStatusCode.LLM_SUCCESS, LLMStatusCode.LLM_ALREADY_LINK):
                    break
                if rets[0] != LLMStatusCode.LLM_LINK_FAILED or time.monotonic() >= deadline:
                    raise LLMException("%s: cannot link to subscriber %d at %s:%d" % (
                        rets[0].name, cluster, remote_ip, remote_port), rets[0])
                time.sleep(0.02)
            try:
                while True:
                    block, nblocks, _ = self._read_header(cluster, deadline)
                    if nblocks > 0:
                        break
                    if time.monotonic() >= deadline:
                        raise LLMException("LLM_TIMEOUT: subscriber %d registered no buffer" %
                                           cluster, LLMStatusCode.LLM_TIMEOUT)
                    time.sleep(0.002)
                if region is None:
                    first, count = 0, nblocks
                else:
                    off, size = (_int(x, "region", 0, 1 << 62) for x in region)
                    if off % block or size % block or size == 0:
                        raise _param("region (%d, %d) is not a multiple of the subscriber's %d-byte "
                                     "blocks" % (off, size, block))
                    first, count = off // block, size // block
                writer = secrets.randbits(62) | 1
                self._message(cluster, {"t": "claim", "w": writer, "f": first, "n": count})
                while True:
                    _, _, rows = self._read_header(cluster, deadline)
                    row = next((w for w in rows if w[0] == self.cluster_id and w[1] == writer), None)
                    if row is not None and row[5] != 0:
                        break
                    if time.monotonic() >= deadline:
                        raise LLMException("LLM_TIMEOUT: subscriber %d did not answer the claim "
                                           "(it serves at most %d publishers)" % (cluster, _MAX_ROWS),
                                           LLMStatusCode.LLM_TIMEOUT)
                    time.sleep(0.001)
                if row[5] == _ROW_OVERLAP:
                    raise _param("region overlaps the region of publisher cluster %d at subscriber "
                                 "%d: give each publisher its own region=" % (row[6], cluster))
                if row[5] != _ROW_ACCEPTED:
                    raise _param("subscriber %d refused the region: it is not inside its %d-block "
                                 "buffer" % (cluster, nblocks))
                s = _Sub()
                s.cluster, s.block, s.first, s.count, s.writer = cluster, block, first, count, writer
                s.head, s.released = 0, row[4]
                cm = self._dd.cache_manager
                s.tail = cm.allocate_host_memory(block)
                s.tail_cache = cm.register_blocks_cache(
                    CacheDesc(1, [1, block], DataType.DT_UINT8, Placement.HOST), [s.tail])
            except BaseException:
                try:
                    self._dd.unlink_clusters([info], timeout=1000)
                except LLMException:
                    pass
                raise
            self._subs[cluster] = s
            return cluster

    def publish(self, cache_id, data, descriptor=None, *, subscriber=None, timeout_ms=5000):
        """Pushes data (numpy array, CPU tensor, bytes-like, HostMemory, or an
        (address, nbytes) tuple; no copy but of a last partial block) into the
        subscriber's buffer as cache_id; returns once the bytes are there.
        descriptor: a CacheDescriptor (default: from an array's or tensor's
        shape and dtype, else bytes). Waits up to timeout_ms for room."""
        self._check()
        cid = _cache_id(cache_id)
        if isinstance(data, tuple):
            addr, n = _int(data[0], "address", 1), _int(data[1], "nbytes", 1)
        else:
            addr, n = _C.address_of(data, False)
            if n is None:
                raise _param("an int address needs its size: pass (address, nbytes)")
        if n == 0:
            raise _param("nothing to publish")
        if descriptor is None:
            if hasattr(data, "shape") and hasattr(data, "dtype"):
                try:
                    descriptor = CacheDescriptor(tuple(data.shape), data.dtype, Placement.HOST)
                except LLMException:
                    descriptor = CacheDescriptor((n,), DataType.DT_UINT8, Placement.HOST)
            else:
                descriptor = CacheDescriptor((n,), DataType.DT_UINT8, Placement.HOST)
        elif not isinstance(descriptor, CacheDescriptor):
            raise _param("descriptor must be a CacheDescriptor")
        elif descriptor.nbytes != n:
            raise _param("the descriptor is %d bytes, the data %d" % (descriptor.nbytes, n))
        deadline = time.monotonic() + _int(timeout_ms, "timeout_ms", 0, 1 << 31) / 1000.0
        with self._lock:
            s = self._sub(subscriber)
            B, R = s.block, s.count
            need = -(-n // B)
            if need > R:
                raise LLMException("LLM_OUT_OF_MEMORY: %d bytes do not fit the %d-byte region at "
                                   "subscriber %d" % (n, R * B, s.cluster),
                                   LLMStatusCode.LLM_OUT_OF_MEMORY)
            pos = s.head
            if pos % R + need > R:
                pos += R - pos % R  # never straddle the region's end
            while pos + need - s.released > R:
                _, _, rows = self._read_header(s.cluster, deadline)
                row = next((w for w in rows if w[0] == self.cluster_id and w[1] == s.writer), None)
                if row is None or row[5] != _ROW_ACCEPTED:
                    raise LLMException("LLM_FAILED: subscriber %d no longer holds this "
                                       "publisher's region" % s.cluster, LLMStatusCode.LLM_FAILED)
                s.released = row[4]
                if pos + need - s.released <= R:
                    break
                if time.monotonic() >= deadline:
                    raise LLMException(
                        "LLM_OUT_OF_MEMORY: the region at subscriber %d is full (%d blocks held); "
                        "the subscriber must release() caches" % (s.cluster, s.head - s.released),
                        LLMStatusCode.LLM_OUT_OF_MEMORY)
                time.sleep(0.002)
            first = s.first + pos % R
            tag = _TAG + json.dumps({"t": "pub", "w": s.writer, "v": pos, "o": first, "b": need,
                                     "n": n, "h": cid.prompt_hash, "s": cid.seq_len,
                                     "d": descriptor._wire()}, separators=(",", ":"))
            if len(tag.encode()) > _MAX_TAG:
                raise _param("prompt_hash is too long for the message (at most ~100 bytes)")
            cm = self._dd.cache_manager
            key = BlocksCacheKey(s.cluster, RECV_MODEL_ID)
            full, rest = divmod(n, B)
            if rest:
                _C.memmove(s.tail, addr + full * B, rest)
                cm.push_blocks(key, s.tail_cache, [0], [first + full],
                               user_tag=None if full else tag, tensor_num_per_layer=1)
            if full:
                src = cm.register_cache(CacheDesc(1, [full, B], DataType.DT_UINT8, Placement.HOST),
                                        [addr])
                try:
                    cm.push_blocks(key, src, range(full), range(first, first + full),
                                   user_tag=tag, tensor_num_per_layer=1)
                finally:
                    cm.unregister_cache(src.cache_id)
            s.head = pos + need

    def notify_not_found(self, cache_id, *, subscriber=None):
        """Tells the subscriber this publisher has no cache_id: its
        subscribe(cache_id) returns SUBSCRIBE_STATUS_NOT_FOUND."""
        self._check()
        cid = _cache_id(cache_id)
        with self._lock:
            s = self._sub(subscriber)
            self._message(s.cluster, {"t": "nf", "h": cid.prompt_hash, "s": cid.seq_len})

    def disconnect(self, subscriber=None):
        """Gives the region back and unlinks."""
        self._check()
        with self._lock:
            s = self._sub(subscriber)
            del self._subs[s.cluster]
            try:
                self._message(s.cluster, {"t": "bye", "w": s.writer})
            except LLMException:
                pass
            info = LLMClusterInfo()
            info.remote_cluster_id = s.cluster
            self._dd.unlink_clusters([info], timeout=1000)
            self._dd.cache_manager.unregister_cache(s.tail_cache.cache_id)

    def finalize(self):
        """Disconnects from every subscriber and stops the publisher."""
        if self._dd is None:
            return
        with self._lock:
            for c in list(self._subs):
                try:
                    self.disconnect(c)
                except LLMException:
                    pass
            self._dd.finalize()
            self._dd = None

    close = finalize

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False
