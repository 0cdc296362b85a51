"""Shared pieces of the vLLM connector: options, identities, the wire form of
kv_transfer_params, and the notification tags.

Nothing here imports vLLM; the scheduler and worker parts do."""
import hashlib
import time

# The connector logs into vLLM's own log (vLLM configures the "vllm" logger:
# its handler, format and VLLM_LOGGING_LEVEL).
LOGGER = "vllm.hixl_connector"

# kv_connector_extra_config keys and their defaults.
DEFAULTS = {
    "listen_host": "127.0.0.1",   # the worker engine's address (decode reads from it)
    "listen_port": 0,             # 0: any free port; N: tensor-parallel rank r listens on N + r
    "transport": "",              # "", "shm", "tcp" or "ucx" (llm_datadist transfer_backend)
    "lease_ms": 120000,           # prefill blocks are freed this long after the prefill ended,
                                  # when no decode read them (the backstop of the notification)
    "link_timeout_ms": 3000,      # making a link to a prefill worker
    "transfer_timeout_ms": 30000, # one read or write of a request's blocks (a transfer
                                  # still running then is stopped and writes nothing later)
    "mode": "pull",               # decode: "pull" reads the prefill's blocks; "push" asks the
                                  # prefill to write them into this decode's blocks
    "transfer_workers": 4,        # threads that run the reads of the decode side
    "host_buffer": "auto",        # "auto": transfer a host copy of a device KV cache when
                                  # vLLM's kv_buffer_device is "cpu"; "on": always; "off": never
    "kv_cache_layout": "",        # a vLLM KV cache layout to ask for, e.g. "BLHNC" (block-outer:
                                  # each block holds every layer, one descriptor per block)
    "metadata_server": "",        # "etcd://host:port[,...]": workers publish themselves there
                                  # and decode links to prefill workers by name, not address
}

# Notification tags: each read of a prefill worker's cache carries
# "hvc1 <transfer id> <decode rank> <reads expected>"; the prefill worker
# frees the request's blocks once every expected decode rank's read arrived.
TAG = "hvc1 "

# The model ids of the caches: KV blocks; the same memory cut into rows (one
# head's K and V of one token: for sides whose tensor parallelism or block
# size differ); and the one-block "mailbox" a decode reads to release a
# prefill request without taking its data.
KV_MODEL_ID = 0
MAILBOX_MODEL_ID = 1
ROWS_MODEL_ID = 2
MAILBOX_BYTES = 64
# Push mode (_push): each worker's "asks", pages a decode writes what it wants
# pushed into and a prefill reads (and uses as scratch for what it read).
ASKS_MODEL_ID = 3
ASK_PAGE = 4096
ASK_PAGES = 512           # 2 MiB per worker
ASK_MAX_PAGES = 64        # one ask: up to 256 KiB (tens of thousands of blocks)

# Push mode's tags: decode -> prefill (a read of the prefill's mailbox)
# "hvp1 <xid> <decode rank> <first page> <pages> <decode cluster> <decode address>";
# prefill -> decode, after the data: "hvd1 <xid> <prefill rank>" (on the KV
# blocks it wrote) or "hvx1 <xid> <prefill rank>" (on the mailbox: it will not write).
ASK_TAG = "hvp1 "
PUSHED_TAG = "hvd1 "
REFUSED_TAG = "hvx1 "

# The version of the "hixl" entry of kv_transfer_params.
PARAMS_VERSION = 1


class ConfigError(ValueError):
    """A kv_connector_extra_config value that cannot be used."""


def options(extra):
    """The connector's options: DEFAULTS overlaid with kv_connector_extra_config.
    Unknown keys and values of the wrong type raise ConfigError, naming them."""
    extra = dict(extra or {})
    unknown = sorted(set(extra) - set(DEFAULTS))
    if unknown:
        raise ConfigError("HixlConnector: unknown kv_connector_extra_config key(s) %s; known: %s"
                          % (unknown, sorted(DEFAULTS)))
    out = dict(DEFAULTS)
    for k, v in extra.items():
        want = type(DEFAULTS[k])
        if want is int:
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise ConfigError("HixlConnector: %s must be an integer, got %r" % (k, v))
            try:
                v = int(v)
            except ValueError:
                raise ConfigError("HixlConnector: %s must be an integer, got %r" % (k, v)) from None
            if v < 0:
                raise ConfigError("HixlConnector: %s must not be negative, got %d" % (k, v))
        elif not isinstance(v, str):
            raise ConfigError("HixlConnector: %s must be a string, got %r" % (k, v))
        out[k] = v
    if out["host_buffer"] not in ("auto", "on", "off"):
        raise ConfigError("HixlConnector: host_buffer must be \"auto\", \"on\" or \"off\", "
                          "got %r" % out["host_buffer"])
    if out["mode"] not in ("pull", "push"):
        raise ConfigError("HixlConnector: mode must be \"pull\" or \"push\", got %r"
                          % out["mode"])
    if not 1 <= out["transfer_timeout_ms"] <= 3600000:
        raise ConfigError("HixlConnector: transfer_timeout_ms must be 1..3600000")
    if out["transport"] not in ("", "shm", "tcp", "ucx"):
        raise ConfigError("HixlConnector: transport must be \"\", \"shm\", \"tcp\" or \"ucx\", "
                          "got %r" % out["transport"])
    if out["listen_port"] > 65535:
        raise ConfigError("HixlConnector: listen_port %d is not a port" % out["listen_port"])
    if out["transfer_workers"] < 1 or out["transfer_workers"] > 64:
        raise ConfigError("HixlConnector: transfer_workers must be 1..64")
    if out["metadata_server"] and not out["metadata_server"].startswith("etcd://"):
        raise ConfigError("HixlConnector: metadata_server must be \"etcd://host:port[,...]\", "
                          "got %r" % out["metadata_server"])
    if out["lease_ms"] < 1:
        raise ConfigError("HixlConnector: lease_ms must be at least 1")
    return out


def cluster_id(engine_id, tp_rank):
    """The LLM-DataDist cluster id of one worker: 48 bits of a hash of vLLM's
    engine id, then the tensor-parallel rank (ids differ between engines and
    between ranks of one engine)."""
    h = int.from_bytes(hashlib.blake2b(str(engine_id).encode(), digest_size=6).digest(), "big")
    return (h << 12) | (tp_rank & 0xFFF)


def tag(xid, rank, expected):
    return "%s%d %d %d" % (TAG, xid, rank, expected)


def parse_tag(user_tag):
    """(transfer id, decode rank, reads expected) of a notification tag, or
    None for other tags (or malformed ones: they come from the network)."""
    if not user_tag.startswith(TAG):
        return None
    parts = user_tag[len(TAG):].split(" ")
    if len(parts) != 3:
        return None
    try:
        xid, rank, expected = (int(x) for x in parts)
    except ValueError:
        return None
    if not (0 <= xid < 2**63 and 0 <= rank < 4096 and 1 <= expected <= 4096):
        return None
    return xid, rank, expected


def ask_tag(xid, rank, page, pages, cluster, address):
    return "%s%d %d %d %d %d %s" % (ASK_TAG, xid, rank, page, pages, cluster, address)


def parse_ask_tag(user_tag):
    """(xid, decode rank, first page, pages, decode cluster, decode address)
    of an ask's tag, or None (malformed tags come from the network too)."""
    if not user_tag.startswith(ASK_TAG):
        return None
    parts = user_tag[len(ASK_TAG):].split(" ")
    if len(parts) != 6:
        return None
    try:
        xid, rank, page, pages, cluster = (int(x) for x in parts[:5])
    except ValueError:
        return None
    host, _, port = parts[5].rpartition(":")
    if not (0 <= xid < 2**63 and 0 <= rank < 4096 and 0 <= page < ASK_PAGES
            and 1 <= pages <= ASK_MAX_PAGES and page + pages <= ASK_PAGES
            and 0 <= cluster < 2**63 and host and port.isdigit() and int(port) < 65536):
        return None
    return xid, rank, page, pages, cluster, parts[5]


def answer_tag(pushed, xid, rank):
    return "%s%d %d" % (PUSHED_TAG if pushed else REFUSED_TAG, xid, rank)


def parse_answer_tag(user_tag):
    """(pushed, xid, prefill rank) of a prefill's answer to an ask, or None."""
    for pushed, head in ((True, PUSHED_TAG), (False, REFUSED_TAG)):
        if user_tag.startswith(head):
            parts = user_tag[len(head):].split(" ")
            if len(parts) != 2:
                return None
            try:
                xid, rank = int(parts[0]), int(parts[1])
            except ValueError:
                return None
            if 0 <= xid < 2**63 and 0 <= rank < 4096:
                return pushed, xid, rank
            return None
    return None


def block_list(v):
    """True for a list of block numbers (from another process)."""
    return isinstance(v, list) and len(v) <= 1 << 20 and all(
        isinstance(b, int) and not isinstance(b, bool) and 0 <= b < 2**31 for b in v)


def transfer_id(v):
    """True for a transfer id a proxy may choose (concurrent routing)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 < v < 2**62


def now():
    """Wall-clock seconds: lease deadlines travel between hosts."""
    return time.time()


class RemoteSpec:
    """What a decode needs to read a prefill request, validated from
    kv_transfer_params (bytes from another process: every field checked)."""

    __slots__ = ("request_id", "engine_id", "block_ids", "ranks", "xid", "expires_at",
                 "block_size", "layout", "tp_size", "xfer_ms", "concurrent", "lease_ms",
                 "num_tokens")

    @classmethod
    def parse(cls, params):
        """RemoteSpec, or raises ValueError saying what is wrong."""
        h = params.get("hixl")
        if not isinstance(h, dict):
            raise ValueError("kv_transfer_params has no \"hixl\" entry (was the prefill "
                             "instance running HixlConnector?)")
        if h.get("v") != PARAMS_VERSION:
            raise ValueError("kv_transfer_params[\"hixl\"] has version %r, this connector "
                             "speaks %d" % (h.get("v"), PARAMS_VERSION))
        s = cls()
        # Concurrent routing (docs/VLLM.md): the proxy sent the request to
        # the prefill and here at once, with the prefill's entry from an
        # earlier answer and a transfer id of its own; no prefill blocks are
        # known yet, and the prefill writes them as it computes them.
        s.concurrent = h.get("concurrent", False)
        if not isinstance(s.concurrent, bool):
            raise ValueError("kv_transfer_params[\"hixl\"][\"concurrent\"] must be true or false")
        s.request_id = params.get("remote_request_id")
        s.engine_id = params.get("remote_engine_id")
        if not isinstance(s.request_id, str) or not isinstance(s.engine_id, str):
            raise ValueError("remote_request_id and remote_engine_id must be strings")
        # One list of block numbers, or one per KV cache group (a hybrid
        # model's); kept as one per group.
        ids = params.get("remote_block_ids")
        if s.concurrent and not ids:
            ids = []
        groups = ids if isinstance(ids, list) and ids and isinstance(ids[0], list) else [ids]
        if len(groups) > 64 or not all(block_list(g) for g in groups):
            raise ValueError("remote_block_ids must be a list of block numbers, or one list "
                             "per KV cache group")
        s.block_ids = groups
        ranks = h.get("ranks")
        if not isinstance(ranks, list) or not ranks:
            raise ValueError("kv_transfer_params[\"hixl\"][\"ranks\"] must be a non-empty list")
        s.ranks = []
        for r in ranks:
            if (not isinstance(r, list) or len(r) != 2 or not isinstance(r[0], str)
                    or not isinstance(r[1], int) or isinstance(r[1], bool)
                    or not 0 <= r[1] < 2**63):
                raise ValueError("each rank must be [\"host:port\", cluster_id], got %r" % (r,))
            s.ranks.append((r[0], r[1]))
        s.xid = h.get("xid")
        s.expires_at = h.get("expires_at")
        s.block_size = h.get("block_size")
        s.tp_size = h.get("tp_size")
        for name in ("xid", "block_size", "tp_size"):
            v = getattr(s, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0 or v >= 2**63:
                raise ValueError("kv_transfer_params[\"hixl\"][%r] must be a count, got %r"
                                 % (name, v))
        if s.tp_size != len(s.ranks):
            raise ValueError("tp_size %d but %d ranks" % (s.tp_size, len(s.ranks)))
        if s.concurrent:
            s.expires_at = None      # the lease starts when the prefill ends
        elif not isinstance(s.expires_at, (int, float)) or isinstance(s.expires_at, bool):
            raise ValueError("kv_transfer_params[\"hixl\"][\"expires_at\"] must be a time")
        s.lease_ms = h.get("lease_ms", DEFAULTS["lease_ms"])
        if not isinstance(s.lease_ms, int) or isinstance(s.lease_ms, bool) or \
                not 1 <= s.lease_ms <= 86400000:
            raise ValueError("kv_transfer_params[\"hixl\"][\"lease_ms\"] must be 1..86400000 ms")
        s.num_tokens = params.get("remote_num_tokens", 0)
        if not isinstance(s.num_tokens, int) or isinstance(s.num_tokens, bool) or \
                not 0 <= s.num_tokens < 2**40:
            raise ValueError("remote_num_tokens must be a count")
        # The prefill's transfer timeout: a push it started before its lease
        # ended writes nothing after expires_at + xfer_ms.
        s.xfer_ms = h.get("xfer_ms", DEFAULTS["transfer_timeout_ms"])
        if not isinstance(s.xfer_ms, int) or isinstance(s.xfer_ms, bool) or \
                not 1 <= s.xfer_ms <= 3600000:
            raise ValueError("kv_transfer_params[\"hixl\"][\"xfer_ms\"] must be 1..3600000 ms")
        s.layout = h.get("layout")
        if not isinstance(s.layout, dict):
            raise ValueError("kv_transfer_params[\"hixl\"][\"layout\"] must be a dict")
        return s
