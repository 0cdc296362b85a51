"""HixlConnector against the installed vLLM (scripts/vllm-env.sh): vLLM's own
connector loading path, and a prefill and a decode instance in two real
processes -- vLLM's v1 Scheduler on each side driving the connector's
scheduler role, the worker role moving real CPU-tensor bytes over shm and tcp
(node.py plays the model runner) -- checked block by block, with no block
left held on either side."""
import inspect
import multiprocessing as mp
import os
import socket
import tempfile
import time

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import node  # noqa: E402  (tests/vllm)

LEASE_MS = 5000
XFER_MS = 3000


class Proc:
    """A process holding Nodes (node.serve); calls go through a pipe."""

    def __init__(self):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=node.serve, args=(child,), daemon=True)
        self.proc.start()

    def call(self, msg, timeout):
        self.conn.send(msg)
        if not self.conn.poll(timeout):
            raise TimeoutError("node process gave no answer in %d s" % timeout)
        kind, val = self.conn.recv()
        if kind != "ok":
            raise AssertionError("in the node process:\n" + val)
        return val

    def new(self, name, *a, **kw):
        self.call(("new", name, a, kw), 300)
        return Ref(self, name)

    def close(self):
        try:
            self.conn.send(("exit",))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


class Ref:
    """One Node in a Proc: node.method(...) runs there."""

    def __init__(self, proc, name):
        self.proc, self.name = proc, name

    def __getattr__(self, method):
        def call(*a, **kw):
            return self.proc.call((self.name, method, a, kw), kw.get("timeout", 30) + 60)
        return call

    def drop(self):
        self.proc.call(("drop", self.name), 60)


@pytest.fixture(scope="module")
def model_dir():
    with tempfile.TemporaryDirectory(prefix="hixl-vllm-model-") as d:
        yield node.write_model_dir(d)


@pytest.fixture(scope="module")
def procs():
    """Two processes, the prefill side and the decode side; every instance
    of the module lives in one of them (vLLM's import is paid twice)."""
    a, b = Proc(), Proc()
    try:
        yield a, b
    finally:
        a.close()
        b.close()


@pytest.fixture(scope="module", params=["shm", "tcp", "push-tcp"])
def pd(request, procs, model_dir):
    """A prefill (kv_producer) and a decode (kv_consumer) instance; the
    decode reads ("shm", "tcp") or has the prefill write ("push-tcp")."""
    mode, _, transport = request.param.rpartition("-")
    extra = {"transport": transport, "lease_ms": LEASE_MS, "transfer_timeout_ms": XFER_MS}
    p = procs[0].new("p-" + request.param, model_dir, "kv_producer", extra)
    d = procs[1].new("d-" + request.param, model_dir, "kv_consumer",
                     dict(extra, link_timeout_ms=3000, mode=mode or "pull"))
    yield p, d
    p.drop()
    d.drop()


# The failure paths are the connector's, not a transport's: tcp only (and
# push mode where its paths differ).
TCP_ONLY = pytest.mark.parametrize("pd", ["tcp"], indirect=True)
PULL_AND_PUSH = pytest.mark.parametrize("pd", ["tcp", "push-tcp"], indirect=True)


@pytest.fixture(autouse=True)
def _fresh(request):
    """Each test starts with no load errors or messages left from the last."""
    if "pd" in request.fixturenames:
        for peer in request.getfixturevalue("pd"):
            peer.clear()
    yield


def prompt(seed, n):
    return [(seed * 7919 + i * 31) % 3800 + 100 for i in range(n)]


def prefill(p, rid, toks):
    """Runs a prompt on the prefill -> the kv_transfer_params it answers with."""
    p.add(rid, toks, {"do_remote_decode": True}, 1)
    params = p.run(until=[rid])[rid]
    assert params and params["do_remote_prefill"] and params["remote_block_ids"], params
    return params


def decode_all(d, cases, params):
    """Runs each prompt on the decode with its prefill's parameters (None:
    added already); every block arrived as the prefill wrote it, no error
    -> the decode's state."""
    for rid, toks in cases.items() if params is not None else ():
        d.add(rid, toks, params[rid], 2)
    d.run(until=list(cases), idle=True)
    s = assert_idle(d)
    assert s["load_errors"] == [] and s["errors"] == [], s
    for rid in cases:
        assert s["checked"][rid] == [], "blocks %s of %s differ" % (s["checked"][rid], rid)
    return s


def is_push(d):
    return d.name.startswith("d-push")


def assert_idle(peer):
    s = peer.state()
    assert s["requests"] == [], s
    assert s["free_blocks"] == s["blocks"] - 1, s   # every block but vLLM's null block
    return s


# ------------------------------------------------------------ loading, API

def _kvt(**extra):
    from vllm.config import KVTransferConfig
    return KVTransferConfig(kv_connector="HixlConnector",
                            kv_connector_module_path="llm_datadist.vllm_connector",
                            kv_role="kv_both", kv_connector_extra_config=extra)


def test_vllm_loads_the_connector_by_module_path():
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from llm_datadist.vllm_connector import HixlConnector
    cls = KVConnectorFactory.get_connector_class(_kvt())
    assert cls is HixlConnector
    assert issubclass(cls, KVConnectorBase_V1)
    assert not cls.__abstractmethods__


def test_every_overridden_method_keeps_vllms_signature():
    """A vLLM that renames or adds a parameter of a method we implement
    fails here, not in a serving engine."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from llm_datadist.vllm_connector import HixlConnector
    checked = 0
    for name, ours in vars(HixlConnector).items():
        base = getattr(KVConnectorBase_V1, name, None)
        if base is None or not callable(ours) or name.startswith("__"):
            continue
        ours = getattr(HixlConnector, name)
        b = [p.name for p in inspect.signature(base).parameters.values()
             if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        o = [p.name for p in inspect.signature(ours).parameters.values()
             if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
        assert o == b, "%s: vLLM has %s, HixlConnector %s" % (name, b, o)
        checked += 1
    assert checked >= 15


def test_options_are_checked_with_clear_errors():
    from llm_datadist.vllm_connector import ConfigError, _common
    assert _common.options({})["lease_ms"] > 0
    assert _common.options({"listen_port": "26000"})["listen_port"] == 26000
    with pytest.raises(ConfigError, match="unknown kv_connector_extra_config key.*'trasnport'"):
        _common.options({"trasnport": "tcp"})
    with pytest.raises(ConfigError, match="transport must be"):
        _common.options({"transport": "rdma"})
    with pytest.raises(ConfigError, match="lease_ms must be an integer"):
        _common.options({"lease_ms": "soon"})
    with pytest.raises(ConfigError, match="listen_port 70000 is not a port"):
        _common.options({"listen_port": 70000})
    with pytest.raises(ConfigError, match="metadata_server must be"):
        _common.options({"metadata_server": "127.0.0.1:2379"})
    with pytest.raises(ConfigError, match="mode must be"):
        _common.options({"mode": "write"})
    with pytest.raises(ConfigError, match="transfer_timeout_ms must be"):
        _common.options({"transfer_timeout_ms": 0})
    with pytest.raises(ConfigError, match="host_buffer must be"):
        _common.options({"host_buffer": "yes"})
    # The layout the connector asks vLLM for: none unless configured.
    from llm_datadist.vllm_connector import HixlConnector
    from types import SimpleNamespace
    assert HixlConnector.get_required_kvcache_layout(
        SimpleNamespace(kv_transfer_config=_kvt())) is None
    assert HixlConnector.get_required_kvcache_layout(
        SimpleNamespace(kv_transfer_config=_kvt(kv_cache_layout="BLHNC"))) == "BLHNC"


def test_kv_cache_groups_of_attention_are_taken_and_recurrent_state_refused():
    """Hybrid models: full and local attention groups are supported (a
    full-attention one counts prefix hits); a group of recurrent state is
    refused at construction, naming it."""
    import types
    import llm_datadist.vllm_connector as hc
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    import torch

    def group(spec, *names):
        return types.SimpleNamespace(kv_cache_spec=spec, layer_names=list(names))
    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32)
    sw = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float32,
                           sliding_window=64)
    cfg = types.SimpleNamespace(kv_cache_groups=[group(sw, "l1"), group(full, "l0")])
    assert hc._groups(cfg)[1] == 1
    MambaSpec = type("MambaSpec", (), {})
    cfg.kv_cache_groups.append(group(MambaSpec(), "m0", "m1"))
    with pytest.raises(hc.ConfigError, match="MambaSpec.*recurrent state is not supported"):
        hc._groups(cfg)


def test_kv_layouts_are_described_or_refused():
    import torch
    from llm_datadist.vllm_connector._plan import LayoutError, mismatch
    from llm_datadist.vllm_connector._regions import describe_kv_caches
    nb = 8
    cpu = {"l0": torch.zeros(nb, 2, 16, 64), "l1": torch.zeros(nb, 2, 16, 64)}
    regions, layout = describe_kv_caches(cpu, ["l0", "l1"], nb, heads=2, block_tokens=16)
    assert len(regions) == 2 and layout["block_bytes"] == 2 * 16 * 64 * 4
    assert regions[0][0] == cpu["l0"].data_ptr()
    assert layout["order"] == "HN" and layout["row_bytes"] == 64 * 4
    split = {"l0": torch.zeros(2, nb, 16, 2, 32)}          # K and V apart (flash-attn NHD)
    regions, layout2 = describe_kv_caches(split, ["l0"], nb, heads=2, block_tokens=16)
    assert len(regions) == 2 and layout2["split_kv"]
    assert regions[1][0] == split["l0"][1].data_ptr()
    assert layout2["order"] == "NH" and layout2["row_bytes"] == 32 * 4
    mla = {"l0": torch.zeros(nb, 16, 576, dtype=torch.bfloat16)}  # MLA: one latent per token
    _, layout3 = describe_kv_caches(mla, ["l0"], nb, heads=1, block_tokens=16, mla=True)
    assert layout3["block_bytes"] == 16 * 576 * 2
    assert layout3["order"] == "NH" and layout3["row_bytes"] == 576 * 2
    _, same = describe_kv_caches({"l0": torch.zeros(nb, 16, 16, 8)}, ["l0"], nb, heads=16,
                                 block_tokens=16)
    assert same["order"] is None          # as many heads as tokens: cannot tell
    with pytest.raises(LayoutError, match="neither its first dimension"):
        describe_kv_caches({"l0": torch.zeros(3, 5)}, ["l0"], nb)
    with pytest.raises(LayoutError, match="not contiguous inside"):
        describe_kv_caches({"l0": torch.zeros(nb, 2, 16, 64)[:, :, :, :32]}, ["l0"], nb)
    cross = torch.zeros(nb, 2, 16, 64)        # blocks of both layers' pages (block-outer)
    regions, lay = describe_kv_caches({"l0": cross[:, 0], "l1": cross[:, 1]}, ["l0", "l1"], nb)
    assert len(regions) == 1 and regions[0][0] == cross.data_ptr() and lay["cross_layer"]
    assert lay["block_bytes"] == 2 * 16 * 64 * 4 and lay["order"] is None
    regions[0][1][3] = 1.0                    # the region's block 3 is block 3 of every layer
    assert bool((cross[3] == 1).all()) and bool((cross[2] == 0).all())
    with pytest.raises(LayoutError, match="not one block-outer KV cache"):
        describe_kv_caches({"l0": torch.zeros(nb, 3, 16, 64)[:, 0],
                            "l1": torch.zeros(nb, 3, 16, 64)[:, 2]}, ["l0", "l1"], nb)
    with pytest.raises(LayoutError, match="differ"):
        describe_kv_caches({"a": torch.zeros(nb, 4), "b": torch.zeros(nb, 8)}, ["a", "b"], nb)
    assert mismatch(layout, layout) == ""
    assert "block_shape" in mismatch(layout, layout3)


def test_worker_handshake_and_shutdown_twice(procs, model_dir):
    n = procs[0].new("hs", model_dir, "kv_both", {"transport": "tcp", "listen_port": "0"})
    h = n.handshake_check()
    assert h["address"].startswith("127.0.0.1:") and h["tp_rank"] == 0
    assert h["layout"]["regions"] == node.NUM_LAYERS and h["layout"]["split_kv"] is False
    assert h["layout"]["heads"] == node.KV_HEADS and h["layout"]["order"] == "HN"
    assert "called twice" in h["again"]
    n.drop()     # shuts every worker role down twice (node.Node.shutdown)


def _layout(heads, b, order="HN", row=256, mla=False):
    return {"layers": 2, "regions": 2, "block_bytes": heads * b * row, "dtype": "torch.float32",
            "block_shape": [heads, b, row // 4] if order == "HN" else [b, heads, row // 4],
            "split_kv": False, "heads": heads, "block_tokens": b, "order": order,
            "row_bytes": row, "mla": mla}


def test_plans_pair_blocks_and_rows_for_every_pairing():
    from llm_datadist.vllm_connector._plan import LayoutError, plan, readers
    same = _layout(4, 16)
    # Equal sides: whole blocks, the prefill's blocks from the first local token on.
    assert plan(same, same, 1, 0, 1, [7, 8], 32, [1, 2, 3, 4]) == \
        [(0, "blocks", [3, 4], [7, 8], 1)]
    # Nothing to read: each prefill rank is released by one decode rank.
    assert plan(same, same, 2, 1, 2, [], 0, [1]) == [(1, "release", [], [], 1)]
    assert plan(same, same, 2, 1, 1, [], 0, [1]) == []
    assert plan(same, same, 2, 0, 1, [], 0, [1]) == [(0, "release", [], [], 1)]
    # Decode TP 2, prefill TP 1: each decode rank reads its two heads; the
    # prefill hears from both.
    d2, p1 = _layout(2, 16), _layout(4, 16)
    (q, kind, rem, loc, n), = plan(d2, p1, 2, 1, 1, [5], 0, [9])
    assert (q, kind, n) == (0, "rows", 2) and len(rem) == len(loc) == 2 * 16
    assert rem[0] == (9 * 4 + 2) * 16 and loc[0] == (5 * 2 + 0) * 16   # head 2 -> local head 0
    # Decode TP 1, prefill TP 4: four reads of one head each.
    acts = plan(_layout(4, 16), _layout(1, 16), 1, 0, 4, [5], 0, [9])
    assert [(q, k, n) for q, k, _, _, n in acts] == [(q, "rows", 1) for q in range(4)]
    assert acts[3][3][0] == (5 * 4 + 3) * 16 and acts[3][2][0] == 9 * 16
    # Block sizes 16 (prefill) and 32 (decode): one decode block from two prefill blocks.
    (_, _, rem, loc, _), = plan(_layout(4, 32), _layout(4, 16), 1, 0, 1, [3], 0, [10, 11])
    assert len(rem) == 4 * 32 and rem[16] == (11 * 4 + 0) * 16 + 0 and loc[16] == (3 * 4) * 32 + 16
    # Heads outer here, tokens outer there.
    (_, _, rem, loc, _), = plan(_layout(4, 16), _layout(4, 16, "NH"), 1, 0, 1, [3], 0, [10])
    assert rem[1] == (10 * 16 + 1) * 4 + 0 and loc[1] == (3 * 4 + 0) * 16 + 1
    # MLA, decode TP 1 and prefill TP 2: rank 0 reads prefill rank 0 and releases rank 1.
    m = _layout(1, 16, "NH", 384, mla=True)
    acts = plan(m, m, 1, 0, 2, [3], 0, [10])
    assert [(q, k, n) for q, k, _, _, n in acts] == [(0, "rows", 1), (1, "release", 1)]
    assert readers(0, 1, 2, 1, 1, True) == [0, 1]
    with pytest.raises(LayoutError, match="row_bytes"):
        plan(_layout(2, 16, row=128), p1, 2, 0, 1, [5], 0, [9])
    with pytest.raises(LayoutError, match="KV heads"):
        plan(_layout(2, 16), _layout(2, 16), 2, 0, 1, [5], 0, [9])
    with pytest.raises(LayoutError, match="cannot be told apart"):
        plan(dict(d2, order=None), p1, 2, 0, 1, [5], 0, [9])
    # KV cache groups (a hybrid model): each group's blocks paired by
    # position from the first local token, null blocks (0) skipped.
    from llm_datadist.vllm_connector._plan import plan_groups
    assert plan_groups(same, same, 1, 0, 1, [[7, 8], [0, 9]], 32, [[1, 2, 3, 4], [0, 0, 5, 6]]) \
        == [(0, "blocks", [3, 4, 6], [7, 8, 9], 1)]
    assert plan_groups(same, same, 1, 0, 1, [[7, 8]], 32, [[1, 2, 3, 4]]) == \
        plan(same, same, 1, 0, 1, [7, 8], 32, [1, 2, 3, 4])
    assert plan_groups(same, same, 2, 1, 2, [[], []], 0, [[1], [2]]) == [(1, "release", [], [], 1)]
    with pytest.raises(LayoutError, match="hybrid model"):
        plan_groups(d2, p1, 2, 0, 1, [[5], [6]], 0, [[9], [8]])
    with pytest.raises(LayoutError, match="2 groups, this decode's 1"):
        plan_groups(same, same, 1, 0, 1, [[5]], 0, [[9], [8]])
    # A window of tokens (a layer-wise write of one step): the blocks that
    # hold any of them, the rows of exactly those.
    assert plan(same, same, 1, 0, 1, [7, 8, 9], 16, [1, 2, 3, 4], (20, 40)) == \
        [(0, "blocks", [2, 3], [7, 8], 1)]
    assert plan(same, same, 1, 0, 1, [7, 8], 32, [1, 2, 3, 4], (0, 16)) == \
        [(0, "release", [], [], 1)]                         # all before the decode's own
    (_, _, rem, loc, _), = plan(d2, p1, 2, 1, 1, [5, 6], 0, [9, 10], (10, 20))
    assert len(rem) == 2 * 10 and rem[0] == (9 * 4 + 2) * 16 + 10 and loc[-1] == (6 * 2 + 1) * 16 + 3
    assert plan_groups(same, same, 1, 0, 1, [[7, 8], [0, 9]], 32, [[1, 2, 3, 4], [0, 0, 5, 6]],
                       (48, 64)) == [(0, "blocks", [4, 6], [8, 9], 1)]


def test_push_asks_and_their_tags_are_checked_before_use():
    """Push mode's asks and tags come from another process: a malformed one
    is refused, naming what is wrong, before anything is written."""
    import json
    from llm_datadist.vllm_connector import _common as c
    from llm_datadist.vllm_connector._push import Pages, encode_ask, parse_ask
    lay = _layout(4, 16)
    good = encode_ask(77, 1, 2, lay, [[3, 4]], 16)       # one list per KV cache group
    a = parse_ask(good + bytes(100), 77, 1)     # pages are zero-padded
    assert (a["tp"], a["local"], a["start"]) == (2, [[3, 4]], 16)
    assert (a["kv_cache"], a["rows_cache"]) == (0, 0)
    raw = json.loads(good)
    bad = {
        "not JSON": b"{nope",
        "version": dict(raw, v=2),
        "transfer": dict(raw, xid=78),
        "tensor-parallel": dict(raw, tp=1),
        "first token": dict(raw, start=-1),
        "block numbers": dict(raw, local=[[3, "4"]]),
        "non-empty": dict(raw, local=[[]]),
        "one per": dict(raw, local=[3, 4]),
        "heads": dict(raw, layout=dict(lay, heads=0)),
        "order": dict(raw, layout=dict(lay, order="XY")),
        "block_shape": dict(raw, layout=dict(lay, block_shape="big")),
        "cache id": dict(raw, kv_cache=-3),
    }
    for what, rec in bad.items():
        data = rec if isinstance(rec, bytes) else json.dumps(rec).encode()
        with pytest.raises(ValueError, match=what):
            parse_ask(data, 77, 1)
    t = c.ask_tag(77, 1, 5, 2, 123, "127.0.0.1:4000")
    assert c.parse_ask_tag(t) == (77, 1, 5, 2, 123, "127.0.0.1:4000")
    for junk in ("hvp1 77 1 5 2 123", "hvp1 77 1 511 2 123 h:1", "hvp1 77 1 0 65 123 h:1",
                 "hvp1 77 1 0 1 123 h:x", "hvp1 -1 1 0 1 1 h:1", "hvd1 77 1"):
        assert c.parse_ask_tag(junk) is None, junk
    assert c.parse_answer_tag(c.answer_tag(True, 77, 3)) == (True, 77, 3)
    assert c.parse_answer_tag(c.answer_tag(False, 77, 3)) == (False, 77, 3)
    assert c.parse_answer_tag("hvd1 77") is None and c.parse_answer_tag("hvx1 a 1") is None
    pages = Pages(8)
    assert [pages.alloc(3), pages.alloc(3), pages.alloc(3)] == [0, 3, None]
    pages.free(0, 3)
    pages.free(3, 3)
    assert pages.free_pages() == 8 and pages.alloc(8) == 0


# ------------------------------------------------------ two real processes

def test_remote_prefill_moves_every_block_and_frees_both_sides(pd):
    p, d = pd
    cases = {"long": prompt(1, 100), "one-block": prompt(2, 16), "short": prompt(3, 5),
             "odd": prompt(4, 37)}
    params = {}
    for rid, toks in cases.items():
        p.add(rid, toks, {"do_remote_decode": True}, 1)
    out = p.run(until=list(cases))
    for rid in cases:
        params[rid] = out[rid]
        assert params[rid]["do_remote_prefill"] is True
        assert params[rid]["remote_request_id"] == rid
        assert len(params[rid]["remote_block_ids"]) == (len(cases[rid]) + 15) // 16
    before = d.state()["stats"].get("read_blocks", 0)
    pushed = p.state()["stats"].get("pushed_blocks", 0)
    for rid, toks in cases.items():
        d.add(rid, toks, params[rid], 3)
    d.run(until=list(cases), idle=True)
    s = assert_idle(d)
    for rid in cases:
        assert s["checked"][rid] == [], "blocks %s of %s differ from the prefill's" % (
            s["checked"][rid], rid)
    assert s["load_errors"] == [], s
    assert s["stats"]["read_blocks"] - before == sum(len(v["remote_block_ids"])
                                                      for v in params.values())
    # The prefill freed each request's blocks on the decode's read (not the lease).
    p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
    ps = assert_idle(p)
    # In push mode the prefill wrote them (and the decode read none).
    written = ps["stats"].get("pushed_blocks", 0) - pushed
    assert written == (s["stats"]["read_blocks"] - before if is_push(d) else 0)


def test_partial_prefix_hit_reads_only_the_missing_blocks(pd):
    p, d = pd
    base = prompt(10, 48)
    pa = prefill(p, "pa", base)
    d.add("pa", base, pa, 1)
    d.run(until=["pa"], idle=True)
    longer = base[:32] + prompt(11, 32)        # the first two blocks are cached on decode
    pb = prefill(p, "pb", longer)
    before = d.state()["stats"]["read_blocks"]
    d.add("pb", longer, pb, 2)
    d.run(until=["pb"], idle=True)
    s = assert_idle(d)
    assert s["checked"]["pb"] == [] and s["load_errors"] == []
    assert s["stats"]["read_blocks"] - before == 2
    p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
    assert_idle(p)


def test_decode_abort_before_scheduling_releases_the_prefill(pd):
    p, d = pd
    toks = prompt(20, 40)
    params = prefill(p, "ab1", toks)
    releases = d.state()["stats"].get("releases", 0)
    d.add("ab1", toks, params, 3)
    d.abort("ab1")
    d.run(until=["ab1"], idle=True)
    assert_idle(d)
    p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)   # freed by the release, before the lease
    assert_idle(p)
    d.step()                                          # vLLM collects stats each step
    assert d.state()["stats"]["releases"] == releases + 1


def test_decode_abort_during_the_read_frees_everything(pd):
    p, d = pd
    toks = prompt(21, 64)
    params = prefill(p, "ab2", toks)
    d.add("ab2", toks, params, 3)
    d.step()                       # the read starts
    d.abort("ab2")
    d.run(until=["ab2"], idle=True)
    assert_idle(d)
    p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
    assert_idle(p)


@TCP_ONLY
def test_prefill_abort_offers_nothing(pd):
    p, _ = pd
    p.add("ab3", prompt(22, 300), {"do_remote_decode": True}, 1)
    p.abort("ab3")
    out = p.run(until=["ab3"], idle=True)
    assert out["ab3"] is None
    assert_idle(p)


@PULL_AND_PUSH
def test_lease_frees_unread_prefill_blocks_and_a_late_read_fails_cleanly(pd):
    p, d = pd
    toks = prompt(30, 33)
    expiries = p.state()["stats"].get("lease_expiries", 0)
    params = prefill(p, "ls", toks)
    t0 = time.monotonic()
    p.run(idle=True, timeout=LEASE_MS / 1000.0 + 20)
    assert time.monotonic() - t0 >= LEASE_MS / 1000.0 - 1.0
    assert_idle(p)
    assert p.state()["stats"]["lease_expiries"] == expiries + 1
    # The decode gets the params too late: no read, the blocks reported,
    # the request computed locally and finished.
    d.add("ls", toks, params, 2)
    out = d.run(until=["ls"], idle=True)
    assert "ls" in out
    s = assert_idle(d)
    assert s["load_errors"], s
    assert any("lease" in e for e in s["errors"]), s["errors"]


@PULL_AND_PUSH
def test_unreachable_prefill_is_a_load_error_not_a_crash(pd):
    p, d = pd
    toks = prompt(40, 50)
    params = prefill(p, "dead", toks)
    with socket.socket() as s:                    # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bad = dict(params, hixl=dict(params["hixl"], ranks=[["127.0.0.1:%d" % port,
                                                         params["hixl"]["ranks"][0][1] + 1]]))
    d.add("dead", toks, bad, 2)
    d.run(until=["dead"], idle=True)
    s = assert_idle(d)
    assert s["load_errors"]
    p.run(idle=True, timeout=LEASE_MS / 1000.0 + 20)   # the lease frees the prefill
    assert_idle(p)


@TCP_ONLY
def test_layout_mismatch_is_refused_with_a_clear_error(pd):
    p, d = pd
    toks = prompt(41, 20)
    params = prefill(p, "lay", toks)
    lay = params["hixl"]["layout"]        # a prefill whose heads are twice as wide
    layout = dict(lay, block_shape=[4, 16, 128], row_bytes=512, block_bytes=2 * lay["block_bytes"])
    d.add("lay", toks, dict(params, hixl=dict(params["hixl"], layout=layout)), 2)
    d.run(until=["lay"], idle=True)
    s = assert_idle(d)
    assert s["load_errors"]
    assert any("KV layout differs" in e and "row_bytes: here 256, prefill 512" in e
               for e in s["errors"]), s["errors"]
    p.run(idle=True, timeout=LEASE_MS / 1000.0 + 20)
    assert_idle(p)


@TCP_ONLY
def test_malformed_params_are_computed_locally(pd):
    _, d = pd
    toks = prompt(42, 20)
    d.add("junk", toks, {"do_remote_prefill": True, "remote_block_ids": "all"}, 2)
    d.run(until=["junk"], idle=True)
    s = assert_idle(d)
    assert s["load_errors"] == []          # nothing was read: nothing to report
    assert "junk" in s["finished"]


@TCP_ONLY
def test_start_load_kv_returns_while_a_link_hangs(pd):
    """A prefill address that accepts connections and never answers: the
    link waits for its timeout on the read pool, not in start_load_kv."""
    p, d = pd
    toks = prompt(43, 20)
    params = prefill(p, "hang", toks)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(8)
        addr = "127.0.0.1:%d" % srv.getsockname()[1]
        bad = dict(params, hixl=dict(params["hixl"], ranks=[[addr, 77]]))
        d.add("hang", toks, bad, 2)
        d.run(until=["hang"], idle=True, timeout=60)
    s = assert_idle(d)
    assert s["load_errors"]
    assert s["stats"]["start_load_kv_max_s"] < 1.0, s["stats"]   # the link timeout is 3 s
    p.run(idle=True, timeout=LEASE_MS / 1000.0 + 20)
    assert_idle(p)


# Prefill and decode instances that differ: tensor-parallel sizes (each
# decode rank reads the KV heads it holds), block sizes, the order of heads
# and tokens inside a block, and MLA (every rank holds the whole latent).
PAIRINGS = {
    "tp1-to-tp2": ({"tp": 1}, {"tp": 2}),
    "tp2-to-tp1": ({"tp": 2}, {"tp": 1}),
    "tp1-to-tp4": ({"tp": 1}, {"tp": 4}),
    "tp4-to-tp1": ({"tp": 4}, {"tp": 1}),
    "block16-to-block32": ({"block_size": 16}, {"block_size": 32}),
    "block32-to-block16": ({"block_size": 32}, {"block_size": 16}),
    "heads-outer-to-tokens-outer": ({}, {"order": "NH"}),
    "mla-tp1-to-tp2": ({"mla": True, "tp": 1}, {"mla": True, "tp": 2}),
    "mla-tp2-to-tp1": ({"mla": True, "tp": 2}, {"mla": True, "tp": 1}),
}


# In push mode the prefill pairs them (from the decode's ask) and writes.
PUSHED_PAIRINGS = ["tp1-to-tp2", "tp4-to-tp1", "block32-to-block16", "mla-tp2-to-tp1"]


@pytest.mark.parametrize("name", sorted(PAIRINGS) + ["push-" + n for n in PUSHED_PAIRINGS])
def test_differing_instances_move_every_head_and_token(procs, model_dir, name):
    mode = "push" if name.startswith("push-") else "pull"
    pk, dk = PAIRINGS[name[5:] if mode == "push" else name]
    extra = {"transport": "shm", "lease_ms": LEASE_MS}
    p = procs[0].new("p-" + name, model_dir, "kv_producer", extra, **pk)
    d = procs[1].new("d-" + name, model_dir, "kv_consumer", dict(extra, mode=mode), **dk)
    try:
        cases = {"a": prompt(50, 70), "b": prompt(51, 9), "c": prompt(52, 32)}
        params = {rid: prefill(p, rid, toks) for rid, toks in cases.items()}
        decode_all(d, cases, params)
        # Every prefill rank heard from every decode rank that read it (or
        # wrote into every decode rank that asked).
        p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
        ps = assert_idle(p)
        assert ps["errors"] == [], ps["errors"]
        assert (ps["stats"].get("pushes", 0) > 0) == (mode == "push"), ps["stats"]
    finally:
        p.drop()
        d.drop()


@pytest.mark.parametrize("mode", ["pull", "push", "push-staged"])
def test_hybrid_models_move_every_group(procs, model_dir, mode):
    """vLLM's hybrid allocator: full-attention and sliding-window layers in
    two KV cache groups overlaying one memory. Each group's blocks move (the
    window's dropped ones are null on the prefill and skipped), checked
    token by token on every layer within the window it keeps; also through
    host copies on both sides (host staging)."""
    extra = {"transport": "shm", "lease_ms": LEASE_MS}
    staged = mode.endswith("-staged")
    p = procs[0].new("p-hybrid-" + mode, model_dir, "kv_producer", extra, hybrid=True,
                     staging=staged)
    d = procs[1].new("d-hybrid-" + mode, model_dir, "kv_consumer",
                     dict(extra, mode=mode.split("-")[0]), hybrid=True, staging=staged)
    try:
        cases = {"a": prompt(60, 100), "b": prompt(61, 9), "c": prompt(62, 48)}
        params = {rid: prefill(p, rid, toks) for rid, toks in cases.items()}
        # Two groups: the full-attention blocks, and the window's (the first
        # ones of a long prompt dropped: null).
        ids = params["a"]["remote_block_ids"]
        assert len(ids) == 2 and len(ids[0]) == 7 and 0 in ids[1] and ids[1][-1] != 0, ids
        before = d.state()["stats"].get("read_blocks", 0)
        s = decode_all(d, cases, params)
        read = s["stats"]["read_blocks"] - before
        assert read == sum(
            len([b for g in v["remote_block_ids"] for b in g if b]) for v in params.values())
        p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
        ps = assert_idle(p)
        assert ps["errors"] == [], ps["errors"]
        if staged:      # every block of both groups went through the host copies
            assert s["stats"].get("h2d_blocks", 0) == read, s["stats"]
            assert ps["stats"].get("d2h_blocks", 0) >= read, ps["stats"]
    finally:
        p.drop()
        d.drop()


@pytest.mark.parametrize("mode,sides", [("pull", "both"), ("push", "both"),
                                        ("pull", "prefill"), ("push", "decode")])
def test_host_staging_moves_a_host_copy_of_the_kv(procs, model_dir, mode, sides):
    """kv_buffer_device "cpu" with the KV in a device (played by the test's
    tensors, host_buffer "on"): peers move a host copy; the prefill copies
    each step's blocks out with vLLM's copy operation before its parameters
    leave, the decode copies what arrived in before vLLM hears of it. Either
    side may stage alone."""
    extra = {"transport": "shm", "lease_ms": LEASE_MS}
    name = "staging-%s-%s" % (mode, sides)
    p = procs[0].new("p-" + name, model_dir, "kv_producer", extra,
                     staging=sides in ("both", "prefill"))
    d = procs[1].new("d-" + name, model_dir, "kv_consumer", dict(extra, mode=mode),
                     staging=sides in ("both", "decode"))
    try:
        cases = {"a": prompt(70, 100), "b": prompt(71, 9), "c": prompt(72, 48)}
        # An ordinary request first: "a" then finds most of its blocks in the
        # prefill's prefix cache, computed for another request.
        p.add("warm", cases["a"], None, 1)
        p.run(until=["warm"], idle=True)
        params = {rid: prefill(p, rid, toks) for rid, toks in cases.items()}
        before = d.state()["stats"].get("read_blocks", 0)
        s = decode_all(d, cases, params)
        read = s["stats"]["read_blocks"] - before
        assert read == sum(len(v["remote_block_ids"]) for v in params.values())
        assert s["stats"].get("h2d_blocks", 0) == (read if sides != "prefill" else 0), s["stats"]
        p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
        ps = assert_idle(p)
        assert ps["errors"] == [], ps["errors"]
        # Every prompt block went out to the host copy (as the steps wrote them).
        assert (ps["stats"].get("d2h_blocks", 0) >= read) == (sides != "decode"), ps["stats"]
    finally:
        p.drop()
        d.drop()


@pytest.mark.parametrize("mode,sides", [("pull", "both"), ("push", "both"),
                                        ("push", "staged"), ("pull", "prefill")])
def test_cross_layer_blocks_move_as_one_region(procs, model_dir, mode, sides):
    """A block-outer KV cache (each block holds every layer's page, as
    vLLM's BL* layouts lay it): one region, one descriptor per block. Alike
    instances move it in either mode, host-staged too; with a per-layer
    decode the difference is refused, named."""
    extra = {"transport": "shm", "lease_ms": LEASE_MS}
    name = "cross-%s-%s" % (mode, sides)
    alike = sides in ("both", "staged")
    p = procs[0].new("p-" + name, model_dir, "kv_producer", extra, cross_layer=True,
                     staging=sides == "staged")
    d = procs[1].new("d-" + name, model_dir, "kv_consumer", dict(extra, mode=mode),
                     cross_layer=alike, staging=sides == "staged")
    try:
        cases = {"a": prompt(80, 100), "b": prompt(81, 9), "c": prompt(82, 48)}
        params = {rid: prefill(p, rid, toks) for rid, toks in cases.items()}
        lay = params["a"]["hixl"]["layout"]
        assert lay["cross_layer"] and lay["regions"] == 1 and lay["layers"] == 2, lay
        if alike:
            decode_all(d, cases, params)
        else:
            for rid, toks in cases.items():
                d.add(rid, toks, params[rid], 2)
            d.run(until=list(cases), idle=True)
            s = assert_idle(d)
            assert s["load_errors"], s
            assert any("block-outer KV layout" in e and "cross_layer" in e
                       for e in s["errors"]), s["errors"]
        p.run(idle=True, timeout=LEASE_MS / 1000.0 + (-1 if alike else 20))
        assert_idle(p)
    finally:
        p.drop()
        d.drop()


def test_hybrid_and_plain_instances_are_refused_with_a_clear_error(procs, model_dir):
    extra = {"transport": "shm", "lease_ms": LEASE_MS}
    p = procs[0].new("p-hybrid-x", model_dir, "kv_producer", extra, hybrid=True)
    d = procs[1].new("d-plain-x", model_dir, "kv_consumer", extra)
    try:
        toks = prompt(63, 40)
        d.add("x", toks, prefill(p, "x", toks), 2)
        d.run(until=["x"], idle=True)
        s = assert_idle(d)
        assert s["load_errors"], s
        assert any("KV cache has 2 groups, this decode's 1" in e for e in s["errors"]), s["errors"]
        p.run(idle=True, timeout=LEASE_MS / 1000.0 + 20)
        assert_idle(p)
    finally:
        p.drop()
        d.drop()


def test_prefill_workers_are_found_by_name_through_etcd(procs, model_dir, etcd):
    """With metadata_server, the decode links to the prefill worker by its
    cluster name in etcd: the address in kv_transfer_params is not used."""
    extra = {"transport": "tcp", "lease_ms": LEASE_MS, "metadata_server": etcd}
    p = procs[0].new("p-etcd", model_dir, "kv_producer", extra)
    d = procs[1].new("d-etcd", model_dir, "kv_consumer", extra)
    try:
        toks = prompt(60, 50)
        params = prefill(p, "etcd", toks)
        h = params["hixl"]
        params = dict(params, hixl=dict(h, ranks=[["192.0.2.1:9", h["ranks"][0][1]]]))
        d.add("etcd", toks, params, 2)
        d.run(until=["etcd"], idle=True)
        s = assert_idle(d)
        assert s["checked"]["etcd"] == [] and s["load_errors"] == [], s
        p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
        assert_idle(p)
    finally:
        p.drop()
        d.drop()


def test_a_sleeping_prefill_is_not_read_and_serves_again_after_waking(pd):
    """vLLM's sleep mode frees the KV memory: the connector unregisters it
    first, so a decode's read fails cleanly (load errors, the request still
    finishes) instead of touching freed memory; after wake-up reads work."""
    p, d = pd
    toks = prompt(70, 40)
    params = prefill(p, "zz1", toks)
    p.sleep()
    d.add("zz1", toks, params, 2)
    d.run(until=["zz1"], idle=True)
    s = assert_idle(d)
    assert s["load_errors"], s
    p.wake()
    p.run(idle=True, timeout=LEASE_MS / 1000.0 + 20)
    assert_idle(p)
    d.clear()
    params = prefill(p, "zz2", toks)
    d.add("zz2", toks, params, 2)
    d.run(until=["zz2"], idle=True)
    s = assert_idle(d)
    assert s["checked"]["zz2"] == [] and s["load_errors"] == [], s
    p.run(idle=True, timeout=LEASE_MS / 1000.0 - 1)
    assert_idle(p)


# ------------------------------------------------------ concurrent routing

def _proxy():
    import importlib.util
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "vllm",
                        "pd_proxy.py")
    spec = importlib.util.spec_from_file_location("pd_proxy", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _until(check, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("name", ["alike", "tp1-to-tp2"])
def test_concurrent_requests_are_written_layer_by_layer(procs, model_dir, name):
    """The proxy sends the request to both instances at once: the decode
    asks before the prefill computes, and each later step of a chunked
    prefill is written layer by layer while the step runs; a decode that
    asks only after the prefill ended gets it all at once. Every block
    arrives; neither side holds a block afterwards."""
    tp_d = 2 if name == "tp1-to-tp2" else 1
    extra = {"transport": "tcp", "lease_ms": LEASE_MS, "transfer_timeout_ms": XFER_MS}
    p = procs[0].new("cp-" + name, model_dir, "kv_producer", extra)
    d = procs[1].new("cd-" + name, model_dir, "kv_consumer", dict(extra, mode="pull"), tp=tp_d)
    try:
        warm = prefill(p, "cw", prompt(60, 20))     # the proxy learns the prefill's entry
        decode_all(d, {"cw": prompt(60, 20)}, {"cw": warm})
        proxy = _proxy()
        p.set_layer_delay(0.2)
        # Asked before the prefill computes its last two chunks (256 tokens
        # a step): those are written as each layer is computed.
        toks = prompt(61, 600)
        p.add("c1", toks, {"do_remote_decode": True, "hixl_xid": 4242}, 1)
        p.step()                                    # the first chunk, before any ask
        d.add("c1", toks, proxy.concurrent_params(warm, 4242), 2)
        d.step()                                    # allocates and asks
        _until(lambda: p.asked(4242) == tp_d, "the prefill never took the ask")
        # Asked after the prefill ended: written at once.
        toks2 = prompt(62, 40)
        p.add("c2", toks2, {"do_remote_decode": True, "hixl_xid": 4243}, 1)
        p.run(until=["c1", "c2"])
        d.add("c2", toks2, proxy.concurrent_params(warm, 4243), 2)
        s = decode_all(d, {"c1": toks, "c2": toks2}, None)
        ps = p.state()
        assert ps["stats"]["layer_writes"] >= 2 * tp_d, ps["stats"]  # the chunks after the ask
        assert ps["stats"]["layers_overlapped"] >= 1, ps["stats"]    # moved during the forward
        assert ps["stats"]["push_failures"] == 0 and ps["errors"] == [], ps
        p.run(until=[], idle=True)
        assert_idle(p)
        assert s["stats"]["read_failures"] == 0
    finally:
        p.set_layer_delay(0)
        p.drop()
        d.drop()


@TCP_ONLY
def test_concurrent_prefill_abort_refuses_the_decode_at_once(pd):
    """A concurrent request aborted on the prefill: the decode's ask is
    refused at once (not at the lease's end), its blocks are load errors and
    the request still finishes; nothing stays held."""
    p, d = pd
    warm = prefill(p, "aw", prompt(70, 20))
    decode_all(d, {"aw": prompt(70, 20)}, {"aw": warm})
    toks = prompt(71, 40)
    d.add("a1", toks, _proxy().concurrent_params(warm, 5151), 2)
    d.step()
    _until(lambda: p.asked(5151) == 1, "the prefill never took the ask")
    p.add("a1", toks, {"do_remote_decode": True, "hixl_xid": 5151}, 1)
    p.abort("a1")
    p.run(until=["a1"], idle=True)
    t0 = time.monotonic()
    d.run(until=["a1"], idle=True, timeout=LEASE_MS / 1000.0)
    assert time.monotonic() - t0 < LEASE_MS / 1000.0 - 1
    s = assert_idle(d)
    assert s["load_errors"] and any("did not write" in e for e in s["errors"]), s
    assert_idle(p)
