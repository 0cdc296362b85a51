"""llm_datadist._core: the LLM-DataDist Python API (LLMDataDist, its cache
manager, the enums, keys and configs) over the C++ bindings in
llm_datadist._llm_datadist. Names and signatures follow the published
LLM-DataDist Python API; what goes beyond it is marked "extension"."""
import enum
import json
import logging
import operator
import socket

from . import _llm_datadist as _C

_log = logging.getLogger("llm_datadist")

_U64 = (1 << 64) - 1
_I64 = (1 << 63) - 1
_U32 = (1 << 32) - 1
_I32 = (1 << 31) - 1


# --------------------------------------------------------------------- enums

class LLMRole(enum.IntEnum):
    """The role of an instance (informational: linking is independent of it)."""
    PROMPT = 1
    DECODER = 2
    MIX = 3


class Placement(enum.IntEnum):
    """Where a cache lives. DEVICE is accepted; the memory is host memory here."""
    HOST = 0
    DEVICE = 1


class DataType(enum.IntEnum):
    """Element types of a CacheDesc (the published values)."""
    DT_FLOAT = 0
    DT_FLOAT16 = 1
    DT_INT8 = 2
    DT_INT32 = 3
    DT_UINT8 = 4
    DT_INT16 = 6
    DT_UINT16 = 7
    DT_UINT32 = 8
    DT_INT64 = 9
    DT_UINT64 = 10
    DT_DOUBLE = 11
    DT_BOOL = 12
    DT_BF16 = 27


class LLMStatusCode(enum.IntEnum):
    """Status codes (the published values)."""
    LLM_SUCCESS = 0x0
    LLM_FAILED = 0xFFFFFFFF
    LLM_WAIT_PROC_TIMEOUT = 0x5010B001
    LLM_KV_CACHE_NOT_EXIST = 0x5010B002
    LLM_PARAM_INVALID = 0x5010B005
    LLM_NOT_YET_LINK = 0x5010B007
    LLM_ALREADY_LINK = 0x5010B008
    LLM_LINK_FAILED = 0x5010B009
    LLM_UNLINK_FAILED = 0x5010B00A
    LLM_CLUSTER_NUM_EXCEED_LIMIT = 0x5010B00C
    LLM_PROCESSING_LINK = 0x5010B00D
    LLM_EXIST_LINK = 0x5010B018
    LLM_FEATURE_NOT_ENABLED = 0x5010B019
    LLM_TIMEOUT = 0x5010B01A
    LLM_OUT_OF_MEMORY = 0x5010B01C


class TransferEventKind(enum.IntEnum):
    """Extension: what happened to one of this instance's caches."""
    PULLED = 0          # a peer read it (the data was already taken)
    PUSHED = 1          # a peer wrote into it (the data is already in place)
    LEASE_EXPIRED = 2   # its request keys were released: nobody pulled in time


def _code(c):
    try:
        return LLMStatusCode(c)
    except ValueError:
        return LLMStatusCode.LLM_FAILED


class LLMException(Exception):
    """Raised by every failing call: .status_code is an LLMStatusCode and
    str(e) the C++ layer's message (e.g. "LLM_PARAM_INVALID (0x5010b005): ...")."""

    def __init__(self, message="", status_code=LLMStatusCode.LLM_FAILED):
        super().__init__(message)
        self._status_code = _code(status_code)

    @property
    def status_code(self):
        return self._status_code


_C._init(LLMException)


def _param(msg):
    return LLMException("LLM_PARAM_INVALID: " + msg, LLMStatusCode.LLM_PARAM_INVALID)


def _int(v, name, lo=0, hi=_U64):
    if isinstance(v, bool):
        raise _param("%s must be an int, got bool" % name)
    try:
        v = operator.index(v)
    except TypeError:
        raise _param("%s must be an int, got %s" % (name, type(v).__name__)) from None
    if not lo <= v <= hi:
        raise _param("%s %d is out of range [%d, %d]" % (name, v, lo, hi))
    return v


def _enum(cls, v, name):
    try:
        return cls(v)
    except (ValueError, TypeError):
        raise _param("%s must be a %s, got %r" % (name, cls.__name__, v)) from None


def _ints(seq, name, hi=_U64):
    if seq is None:
        return []
    if isinstance(seq, (str, bytes)):
        raise _param("%s must be a sequence of ints" % name)
    try:
        return [_int(x, name + " entry", 0, hi) for x in seq]
    except TypeError:
        raise _param("%s must be a sequence of ints, got %s" % (name, type(seq).__name__)) from None


def _range(r, name):
    """A Python range (range(2, 5): layers 2, 3, 4) -> the inclusive C++ pair;
    None -> (-1, -1), every layer."""
    if r is None:
        return (-1, -1)
    if not isinstance(r, range):
        raise _param("%s must be a range or None, got %s" % (name, type(r).__name__))
    if r.step != 1:
        raise _param("%s %r: only ranges with step 1 are supported" % (name, r))
    if len(r) == 0 or r.start < 0 or r.stop - 1 > _I32:
        raise _param("%s %r is empty or out of range" % (name, r))
    return (r.start, r.stop - 1)


def _from_pair(p):
    a, b = p
    return None if a < 0 else range(a, b + 1)


def _tag(user_tag):
    if user_tag is None or isinstance(user_tag, (str, bytes, bytearray, memoryview)):
        return user_tag
    raise _param("user_tag must be str, bytes or None")


# --------------------------------------------------------------------- config

def _ip(ip, name):
    """A dotted/colon string, or (as the published API) the int whose
    little-endian bytes are the IPv4 octets: 0x0100007F is 127.0.0.1."""
    if isinstance(ip, str):
        for fam in (socket.AF_INET, socket.AF_INET6):
            try:
                socket.inet_pton(fam, ip)
                return ip
            except OSError:
                pass
        raise _param("%s %r is not an IPv4 or IPv6 address" % (name, ip))
    v = _int(ip, name, 0, _U32)
    return socket.inet_ntoa(v.to_bytes(4, "little"))


class LLMConfig:
    """Instance options; generate_options() gives the dict for LLMDataDist.init.

    listen_ip_info ("ip:port", port 0: any free port), sync_kv_timeout (ms),
    device_id, enable_switch_role, transfer_backend ("hixl"),
    global_resource_config (dict or JSON string of hixl engine options, e.g.
    {"LinkType": "TCP"}), cache_lease_ms (extension: default lease of keyed
    caches), share_caches_by_mapping (extension: register the application's
    tensors so peers on this host map them; private memory is moved in place
    into a sealed memfd, see docs/USER_MEMORY.md) and ge_options (a dict of further "llm.*" options, passed as
    given). enable_cache_manager and enable_remote_cache_accessible are
    accepted for ported code: the cache manager is always on and linked peers
    can always reach registered caches. mem_utilization and buf_pool_cfg
    (device memory pools) are accepted and unused."""

    __slots__ = ("listen_ip_info", "sync_kv_timeout", "device_id", "enable_cache_manager",
                 "enable_remote_cache_accessible", "transfer_backend", "global_resource_config",
                 "enable_switch_role", "cache_lease_ms", "share_caches_by_mapping",
                 "ge_options", "mem_utilization",
                 "buf_pool_cfg")

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, None)

    def generate_options(self):
        o = {}
        if self.listen_ip_info is not None:
            s = str(self.listen_ip_info)
            host, sep, port = s.rpartition(":")
            if not sep or not host or not port.isdigit() or int(port) > 65535:
                raise _param("listen_ip_info must be \"ip:port\", got %r" % s)
            o[_C.options.LISTEN_IP_INFO] = s
        if self.sync_kv_timeout is not None:
            o[_C.options.SYNC_KV_CACHE_WAIT_TIME] = str(
                _int(self.sync_kv_timeout, "sync_kv_timeout", 0, _I32))
        if self.device_id is not None:
            d = self.device_id
            if isinstance(d, (list, tuple)):
                o[_C.options.DEVICE_ID] = ",".join(str(_int(x, "device_id", 0, _I32)) for x in d)
            else:
                o[_C.options.DEVICE_ID] = str(_int(d, "device_id", 0, _I32))
        if self.enable_switch_role is not None:
            o[_C.options.ENABLE_SWITCH_ROLE] = "1" if self.enable_switch_role else "0"
        if self.transfer_backend is not None:
            o[_C.options.TRANSFER_BACKEND] = str(self.transfer_backend)
        if self.global_resource_config is not None:
            g = self.global_resource_config
            if isinstance(g, dict):
                g = json.dumps(g)
            elif not isinstance(g, str):
                raise _param("global_resource_config must be a dict or a JSON string")
            o[_C.options.GLOBAL_RESOURCE_CONFIG] = g
        if self.cache_lease_ms is not None:
            o[_C.options.CACHE_LEASE_MS] = str(_int(self.cache_lease_ms, "cache_lease_ms", 0, _I64))
        if self.share_caches_by_mapping is not None:
            o[_C.options.SHARE_CACHES_BY_MAPPING] = "1" if self.share_caches_by_mapping else "0"
        if self.ge_options is not None:
            if not isinstance(self.ge_options, dict):
                raise _param("ge_options must be a dict")
            o.update({str(k): str(v) for k, v in self.ge_options.items()})
        return o

    def __repr__(self):
        return "LLMConfig(%s)" % ", ".join(
            "%s=%r" % (k, getattr(self, k)) for k in self.__slots__ if getattr(self, k) is not None)


LlmConfig = LLMConfig


class LLMClusterInfo:
    """A cluster to link to: remote_cluster_id, remote_role_type and its
    addresses. IPs are strings ("127.0.0.1", "::1") or, as in the published
    API, ints whose little-endian bytes are the IPv4 octets (0x0100007F)."""

    def __init__(self):
        self.remote_cluster_id = 0
        self.remote_role_type = 0
        self.local_ip_infos = []    # [(ip, port)]; accepted, the engine picks the route
        self.remote_ip_infos = []   # [(ip, port)]; the first reachable one is linked

    def append_local_ip_info(self, ip, port):
        self.local_ip_infos.append((_ip(ip, "ip"), _int(port, "port", 0, 65535)))

    def append_remote_ip_info(self, ip, port):
        self.remote_ip_infos.append((_ip(ip, "ip"), _int(port, "port", 0, 65535)))

    def _tuple(self):
        role = self.remote_role_type
        return (_int(self.remote_cluster_id, "remote_cluster_id"),
                _int(int(role) if isinstance(role, enum.Enum) else role, "remote_role_type",
                     -(1 << 31), _I32),
                list(self.local_ip_infos), list(self.remote_ip_infos))

    def __repr__(self):
        return "LLMClusterInfo(remote_cluster_id=%d, remote=%r)" % (self.remote_cluster_id,
                                                                   self.remote_ip_infos)


# --------------------------------------------------------------------- caches and keys

class CacheDesc:
    """num_tensors tensors of one shape and data type; shape[0] is the batch
    (whole caches) or the block count (paged caches)."""

    def __init__(self, num_tensors, shape, data_type, placement=Placement.DEVICE):
        self.num_tensors = _int(num_tensors, "num_tensors", 1, _U32)
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise _param("shape must be a sequence of ints")
        self.shape = [_int(d, "shape dim", 1, _I64) for d in shape]
        if not self.shape:
            raise _param("shape must not be empty")
        self.data_type = _enum(DataType, data_type, "data_type")
        self.placement = _enum(Placement, placement, "placement")

    @property
    def tensor_size(self):
        """Extension: bytes of one tensor."""
        n = _C.data_type_size(int(self.data_type))
        for d in self.shape:
            n *= d
        return n

    def __eq__(self, o):
        return isinstance(o, CacheDesc) and (self.num_tensors, self.shape, self.data_type,
                                             self.placement) == (o.num_tensors, o.shape,
                                                                 o.data_type, o.placement)

    def __repr__(self):
        return "CacheDesc(num_tensors=%d, shape=%r, data_type=%s, placement=%s)" % (
            self.num_tensors, self.shape, self.data_type.name, self.placement.name)


class _Key:
    _fields = ()

    def _t(self):
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, o):
        return type(o) is type(self) and o._t() == self._t()

    def __hash__(self):
        return hash((type(self).__name__,) + self._t())

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__,
                           ", ".join("%s=%r" % (f, getattr(self, f)) for f in self._fields))


class CacheKey(_Key):
    """A request's key: the batch entry of a cache prompt_cluster_id
    registered with this key (register_cache(..., cache_keys=[...]))."""
    _fields = ("prompt_cluster_id", "req_id", "model_id")

    def __init__(self, prompt_cluster_id, req_id, model_id=0):
        self.prompt_cluster_id = _int(prompt_cluster_id, "prompt_cluster_id")
        self.req_id = _int(req_id, "req_id")
        self.model_id = _int(model_id, "model_id")


class CacheKeyByIdAndIndex(_Key):
    """A peer's cache by its id, and a batch entry of it."""
    _fields = ("cluster_id", "cache_id", "batch_index")

    def __init__(self, cluster_id, cache_id, batch_index=0):
        self.cluster_id = _int(cluster_id, "cluster_id")
        self.cache_id = _int(cache_id, "cache_id", 1, _I64)
        self.batch_index = _int(batch_index, "batch_index", 0, _U32)


class BlocksCacheKey(_Key):
    """A peer's paged cache by its model: the one prompt_cluster_id
    registered with register_blocks_cache(..., BlocksCacheKey(.., model_id))."""
    _fields = ("prompt_cluster_id", "model_id")

    def __init__(self, prompt_cluster_id, model_id=0):
        self.prompt_cluster_id = _int(prompt_cluster_id, "prompt_cluster_id")
        self.model_id = _int(model_id, "model_id")


class Cache:
    """A registered local cache: cache_id (1, 2, ... per instance),
    cache_desc and tensor_addrs (one address per tensor)."""

    def __init__(self, cache_id, cache_desc, tensor_addrs):
        self.cache_id = cache_id
        self.cache_desc = cache_desc
        self.tensor_addrs = list(tensor_addrs)

    @property
    def per_device_tensor_addrs(self):
        return [list(self.tensor_addrs)]

    def __repr__(self):
        return "Cache(cache_id=%d, %r)" % (self.cache_id, self.cache_desc)


class TransferConfig:
    """One destination of transfer_cache_async: a peer's registered memory by
    its remote tensor addresses (one per tensor of the destination layers)."""

    def __init__(self, dst_cluster_id, dst_addrs, src_layer_range=None, src_batch_index=0):
        self.dst_cluster_id = _int(dst_cluster_id, "dst_cluster_id")
        self.dst_addrs = _ints(dst_addrs, "dst_addrs")
        self.src_layer_range = src_layer_range
        self.src_batch_index = _int(src_batch_index, "src_batch_index", 0, _U32)

    def _tuple(self):
        return (self.dst_cluster_id, 0, list(self.dst_addrs), None,
                _range(self.src_layer_range, "src_layer_range"), (-1, -1),
                self.src_batch_index, 0)


class TransferWithCacheKeyConfig:
    """One destination of transfer_cache_async by key: a CacheKey of the
    destination cluster (its batch entry), or a CacheKeyByIdAndIndex."""

    def __init__(self, cache_key, src_layer_range=None, dst_layer_range=None):
        if not isinstance(cache_key, (CacheKey, CacheKeyByIdAndIndex)):
            raise _param("cache_key must be a CacheKey or a CacheKeyByIdAndIndex")
        self.cache_key = cache_key
        self.src_layer_range = src_layer_range
        self.dst_layer_range = dst_layer_range

    def _tuple(self):
        k = self.cache_key
        src = _range(self.src_layer_range, "src_layer_range")
        dst = _range(self.dst_layer_range, "dst_layer_range")
        if isinstance(k, CacheKey):
            return (k.prompt_cluster_id, 0, [], (k.prompt_cluster_id, k.req_id, k.model_id),
                    src, dst, 0, 0)
        return (k.cluster_id, k.cache_id, [], None, src, dst, 0, k.batch_index)


class LayerSynchronizer:
    """Subclass it for transfer_cache_async: synchronize_layer(layer_index,
    timeout_in_millis) is called (on the task's thread, GIL taken) before
    layer layer_index moves; return True once the layer's data is ready,
    False to fail the task. An exception counts as False (and is printed)."""

    def synchronize_layer(self, layer_index, timeout_in_millis):
        raise NotImplementedError


class LayerGates:
    """Extension: gates for transfer_cache_async that a task's thread waits
    for without Python's GIL -- the form to use when the thread that opens
    them is busy (a model's forward pass). open(i) lets layer i move;
    open_all() every layer; fail() fails the layers still waiting. early:
    how many layers were let through by their own open() (not open_all)."""

    def __init__(self, layers):
        self._g = _C.LayerGates(_int(layers, "layers", 0, _U32))

    def open(self, layer):
        self._g.open(_int(layer, "layer", 0, _U32))

    def open_all(self):
        self._g.open_all()

    def fail(self):
        self._g.fail()

    @property
    def early(self):
        return self._g.early


class CacheTask:
    """A posted transfer_cache_async."""

    def __init__(self, task):
        self._task = task

    def synchronize(self, timeout_in_millis=None):
        """Waits for the end (None: without limit). LLM_SUCCESS, or raises
        LLMException: LLM_TIMEOUT when not done in time (it goes on), else the
        first failure."""
        t = -1 if timeout_in_millis is None else _int(timeout_in_millis, "timeout_in_millis", 0,
                                                      _I32)
        code, msg = self._task.wait(t)
        if code != 0:
            raise LLMException(msg, code)
        return LLMStatusCode.LLM_SUCCESS

    def done(self):
        """Extension: True once every layer of every config has ended."""
        return self._task.done()

    def get_results(self):
        """One LLMStatusCode per transfer config (waits for the end first)."""
        if not self._task.done():
            self._task.wait(-1)
        return [_code(c) for c, _ in self._task.results()]


class KvTransferEvent:
    """Extension: a pull or push of one of this instance's caches completed
    (kind PULLED/PUSHED, after the data), or a keyed cache's lease expired.
    key: the CacheKey it was pulled by (or None); blocks: local blocks moved;
    batch_index: local batch entry moved (-1 for block transfers);
    layer_range: local layers moved (a range; None: every layer); user_tag:
    the mover's user_tag (str, "" when none)."""

    __slots__ = ("kind", "peer_cluster_id", "cache_id", "key", "blocks", "batch_index",
                 "layer_range", "user_tag")

    def __init__(self, t):
        kind, self.peer_cluster_id, self.cache_id, key, self.blocks, self.batch_index, lr, \
            self.user_tag = t
        self.kind = _enum(TransferEventKind, kind, "kind")
        self.key = None if key is None else CacheKey(*key)
        self.layer_range = _from_pair(lr)

    def __repr__(self):
        return "KvTransferEvent(%s)" % ", ".join("%s=%r" % (k, getattr(self, k))
                                                 for k in self.__slots__)


# --------------------------------------------------------------------- the instance

def _local(cache, name):
    if not isinstance(cache, Cache):
        raise _param("%s must be a Cache from register_cache/register_blocks_cache" % name)
    return cache.cache_id


class CacheManager:
    """LLMDataDist.cache_manager: registers this instance's caches and moves
    KV data between them and linked peers' caches. Every failure raises
    LLMException."""

    def __init__(self, owner):
        self._dd = owner._dd

    # -- registration
    def register_cache(self, cache_desc, addrs, cache_keys=(), *, lease_ms=0):
        """Registers num_tensors tensors (int addresses, numpy arrays, CPU
        torch tensors, any writable buffer; no copies, each at least
        cache_desc.tensor_size bytes and held until unregistered) for linked
        peers. cache_keys[i] names batch entry i for pulls by CacheKey;
        lease_ms (extension): the keys are released when nobody pulled by them
        that long (0: the instance default, llm.CacheLeaseMs)."""
        return self._register(cache_desc, addrs, cache_keys, lease_ms, None)

    def register_blocks_cache(self, cache_desc, addrs, blocks_cache_key=None):
        """Registers a paged cache (shape[0]: blocks). With blocks_cache_key,
        peers find it by BlocksCacheKey(this cluster, blocks_cache_key.model_id)."""
        mid = None
        if blocks_cache_key is not None:
            if not isinstance(blocks_cache_key, BlocksCacheKey):
                raise _param("blocks_cache_key must be a BlocksCacheKey or None")
            mid = blocks_cache_key.model_id
        return self._register(cache_desc, addrs, (), 0, mid)

    def _register(self, desc, addrs, keys, lease_ms, mid):
        if not isinstance(desc, CacheDesc):
            raise _param("cache_desc must be a CacheDesc")
        if isinstance(addrs, (str, bytes)) or not hasattr(addrs, "__len__"):
            raise _param("addrs must be a list (one address, array or tensor per tensor)")
        addrs = list(addrs)
        if len(addrs) != desc.num_tensors:
            raise _param("%d addrs for a CacheDesc of %d tensors" % (len(addrs), desc.num_tensors))
        ks = []
        for k in keys or ():
            if not isinstance(k, CacheKey):
                raise _param("cache_keys must hold CacheKey objects")
            ks.append((k.prompt_cluster_id, k.req_id, k.model_id))
        cid, taddrs = self._dd.register(int(desc.placement), desc.num_tensors, int(desc.data_type),
                                        list(desc.shape), addrs, ks,
                                        _int(lease_ms, "lease_ms", 0, _I64), mid)
        return Cache(cid, desc, taddrs)

    def unregister_cache(self, cache_id):
        """Unregisters a cache (returns once no peer's transfer touches it) and
        releases the objects behind it."""
        if isinstance(cache_id, Cache):
            cache_id = cache_id.cache_id
        self._dd.unregister(_int(cache_id, "cache_id", 0, _I64))

    def allocate_host_memory(self, size):
        """Extension: size bytes of this instance's host memory (peers on this
        host map it directly). A HostMemory; freed when its last reference
        goes or at finalize (do not use it after finalize)."""
        return self._dd.alloc_host(_int(size, "size", 1))

    # -- transfers
    def _move(self, push, blocks, key, cache, cname, local_batch, size, local_blocks,
              remote_blocks, src_range, dst_range, tpl, user_tag):
        cid = _local(cache, cname)
        if isinstance(key, CacheKeyByIdAndIndex):
            kind, a, b, c = 0, key.cluster_id, key.cache_id, key.batch_index
        elif isinstance(key, CacheKey) and not blocks:
            kind, a, b, c = 1, key.prompt_cluster_id, key.req_id, key.model_id
        elif isinstance(key, BlocksCacheKey) and blocks:
            kind, a, b, c = 2, key.prompt_cluster_id, key.model_id, 0
        else:
            want = "a BlocksCacheKey or a CacheKeyByIdAndIndex" if blocks else \
                "a CacheKey or a CacheKeyByIdAndIndex"
            raise _param("the remote cache key must be %s, got %s" % (want, type(key).__name__))
        self._dd.transfer(push, blocks, kind, a, b, c, cid,
                          _int(local_batch, "batch_index", 0, _U32),
                          _int(size, "size", -1, _I64),
                          _ints(local_blocks, "blocks"), _ints(remote_blocks, "blocks"),
                          _range(src_range, "src_layer_range"),
                          _range(dst_range, "dst_layer_range"),
                          _int(tpl, "tensor_num_per_layer", 1, _I32), _tag(user_tag))

    def pull_cache(self, cache_key, cache, batch_index=0, size=-1, src_layer_range=None,
                   dst_layer_range=None, *, tensor_num_per_layer=2, user_tag=None):
        """Pulls a peer's batch entry (cache_key: CacheKey, or
        CacheKeyByIdAndIndex) into batch entry batch_index of the local cache:
        size bytes per tensor (-1: a whole entry) of the layer ranges."""
        self._move(False, False, cache_key, cache, "cache", batch_index, size, None, None,
                   src_layer_range, dst_layer_range, tensor_num_per_layer, user_tag)

    def pull_blocks(self, src_cache_key, dst_cache, src_blocks=(), dst_blocks=(),
                    src_layer_range=None, dst_layer_range=None, *, tensor_num_per_layer=2,
                    user_tag=None):
        """Pulls block src_blocks[i] of a peer's paged cache (BlocksCacheKey or
        CacheKeyByIdAndIndex) into block dst_blocks[i] of dst_cache."""
        self._move(False, True, src_cache_key, dst_cache, "dst_cache", 0, -1, dst_blocks,
                   src_blocks, src_layer_range, dst_layer_range, tensor_num_per_layer, user_tag)

    def push_cache(self, dst_cache_key, src_cache, src_batch_index=0, size=-1,
                   src_layer_range=None, dst_layer_range=None, *, tensor_num_per_layer=2,
                   user_tag=None):
        """Pushes batch entry src_batch_index of src_cache into a peer's batch
        entry (CacheKey, or CacheKeyByIdAndIndex)."""
        self._move(True, False, dst_cache_key, src_cache, "src_cache", src_batch_index, size,
                   None, None, src_layer_range, dst_layer_range, tensor_num_per_layer, user_tag)

    def push_blocks(self, dst_cache_key, src_cache, src_blocks=(), dst_blocks=(),
                    src_layer_range=None, dst_layer_range=None, *, tensor_num_per_layer=2,
                    user_tag=None):
        """Pushes block src_blocks[i] of src_cache into block dst_blocks[i] of a
        peer's paged cache (BlocksCacheKey or CacheKeyByIdAndIndex)."""
        self._move(True, True, dst_cache_key, src_cache, "src_cache", 0, -1, src_blocks,
                   dst_blocks, src_layer_range, dst_layer_range, tensor_num_per_layer, user_tag)

    def transfer_cache_async(self, src_cache, layer_synchronizer, transfer_configs,
                             src_block_indices=None, dst_block_indices=None, *,
                             tensor_num_per_layer=2):
        """A layer-wise push of src_cache to every config's destination
        (TransferConfig, TransferWithCacheKeyConfig): layer by layer,
        layer_synchronizer.synchronize_layer(i, timeout) is called first and
        layer i moves once it returned True. With block indices, blocks
        src[i] -> dst[i]; without, whole batch entries. Checks everything
        before it returns a CacheTask."""
        cid = _local(src_cache, "src_cache")
        if isinstance(transfer_configs, (TransferConfig, TransferWithCacheKeyConfig)):
            transfer_configs = [transfer_configs]
        cfgs = []
        for c in transfer_configs:
            if not isinstance(c, (TransferConfig, TransferWithCacheKeyConfig)):
                raise _param("transfer_configs must hold TransferConfig or "
                             "TransferWithCacheKeyConfig objects")
            cfgs.append(c._tuple())
        if isinstance(layer_synchronizer, LayerGates):
            layer_synchronizer = layer_synchronizer._g
        elif layer_synchronizer is not None and not callable(
                getattr(layer_synchronizer, "synchronize_layer", None)):
            raise _param("layer_synchronizer must be a LayerSynchronizer or LayerGates")
        task = self._dd.transfer_cache_async(cid, layer_synchronizer, cfgs,
                                             _ints(src_block_indices, "src_block_indices"),
                                             _ints(dst_block_indices, "dst_block_indices"),
                                             _int(tensor_num_per_layer, "tensor_num_per_layer",
                                                  1, _I32))
        return CacheTask(task)

    # -- events (extension)
    def get_transfer_events(self):
        """Takes the queued KvTransferEvents about this instance's caches,
        oldest first (only while no callback is set)."""
        return [KvTransferEvent(t) for t in self._dd.get_events()]

    def set_transfer_callback(self, callback):
        """callback(KvTransferEvent) gets every event from now on, on an
        instance thread in arrival order (exceptions are printed); None: back
        to get_transfer_events. It must not call finalize."""
        if callback is None:
            self._dd.set_callback(None)
            return
        if not callable(callback):
            raise _param("callback must be callable or None")
        self._dd.set_callback(lambda t: callback(KvTransferEvent(t)))


def _optval(v):
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, dict):
        return json.dumps(v)
    return str(v)


class LLMDataDist:
    """One LLM-DataDist instance: LLMDataDist(role, cluster_id), then
    init(LLMConfig().generate_options()), link_clusters, cache_manager, ...,
    finalize() (also done at interpreter exit for instances still alive).
    Linking is directional: after A links to B, A may pull from and push into
    every cache B registered; B needs no call of its own."""

    def __init__(self, role, cluster_id):
        self._role = _enum(LLMRole, role, "role")
        self._cluster_id = _int(cluster_id, "cluster_id")
        self._dd = _C.DataDist(self._cluster_id, int(self._role))
        self._cache_manager = CacheManager(self)

    def init(self, options):
        """Starts the instance (options: LLMConfig.generate_options())."""
        if not isinstance(options, dict):
            raise _param("options must be a dict (LLMConfig.generate_options())")
        self._dd.initialize({str(k): _optval(v) for k, v in options.items()})

    def finalize(self):
        """Unlinks, unregisters every cache, stops the engine. Safe twice."""
        self._dd.finalize()

    def _clusters(self, clusters):
        if isinstance(clusters, LLMClusterInfo):
            clusters = [clusters]
        out = []
        for c in clusters:
            if not isinstance(c, LLMClusterInfo):
                raise _param("clusters must hold LLMClusterInfo objects")
            out.append(c._tuple())
        return out

    def _links(self, what, ts, res):
        code, msg, rets = res
        if len(rets) != len(ts):
            raise LLMException(msg or "%s failed" % what, code)
        for t, (c, m) in zip(ts, rets):
            if c != 0:
                _log.warning("%s cluster %d: %s", what, t[0], m)
        return _code(code), [_code(c) for c, _ in rets]

    def link_clusters(self, clusters, timeout=3000):
        """Links to each cluster -> (LLMStatusCode, [LLMStatusCode per cluster]):
        LLM_SUCCESS, LLM_ALREADY_LINK, LLM_LINK_FAILED, LLM_PARAM_INVALID (the
        messages go to the "llm_datadist" logger). Raises LLMException when
        the call itself cannot run (bad arguments, not initialized)."""
        ts = self._clusters(clusters)
        return self._links("link", ts, self._dd.link(ts, _int(timeout, "timeout", 0, _I32)))

    def unlink_clusters(self, clusters, timeout=3000, force=False):
        """Unlinks -> (LLMStatusCode, [LLMStatusCode per cluster]);
        LLM_NOT_YET_LINK for a cluster not linked. force: skip waiting for
        in-flight transfers."""
        ts = self._clusters(clusters)
        return self._links("unlink", ts, self._dd.unlink(ts, _int(timeout, "timeout", 0, _I32),
                                                         bool(force)))

    def switch_role(self, role, switch_options=None):
        """Changes the role (needs enable_switch_role at init); links and
        caches are kept. switch_options may repeat llm.ListenIpInfo only."""
        role = _enum(LLMRole, role, "role")
        opts = {} if switch_options is None else switch_options
        if not isinstance(opts, dict):
            raise _param("switch_options must be a dict or None")
        self._dd.set_role(int(role), {str(k): _optval(v) for k, v in opts.items()})
        self._role = role

    @property
    def cache_manager(self):
        return self._cache_manager

    @property
    def cluster_id(self):
        return self._cluster_id

    @property
    def role(self):
        """Extension: the current LLMRole."""
        return _code_role(self._dd.role())

    @property
    def local_address(self):
        """Extension: the engine's address, "ip:port" (the port chosen when
        listen_ip_info asked for port 0)."""
        return self._dd.local_address()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finalize()
        return False

    def __repr__(self):
        return "LLMDataDist(role=%s, cluster_id=%d)" % (self._role.name, self._cluster_id)


def _code_role(r):
    try:
        return LLMRole(r)
    except ValueError:
        return r


def allocate_host_memory(size):
    """size bytes of page-aligned host memory (LlmDataDist::AllocHostMemory of
    a module-level instance) as a HostMemory: buffer protocol
    (numpy.asarray(m), memoryview(m)), .address, .size. Freed when its last
    reference goes (a registered cache holds one)."""
    return _C.allocate_host_memory(_int(size, "size", 1))


HostMemory = _C.HostMemory
