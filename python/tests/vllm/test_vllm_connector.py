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


class Peer:
    """A Node in a process of its own; calls go through a pipe."""

    def __init__(self, *args, **kwargs):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=node.serve, args=(child, args, kwargs), daemon=True)
        self.proc.start()

    def ready(self, timeout=240):
        self._answer(timeout)

    def _answer(self, timeout):
        if not self.conn.poll(timeout):
            raise TimeoutError("node gave no answer in %d s" % timeout)
        kind, val = self.conn.recv()
        if kind != "ok":
            raise AssertionError("in the node process:\n" + val)
        return val

    def __getattr__(self, name):
        def call(*a, **kw):
            self.conn.send((name, a, kw))
            return self._answer(kw.get("timeout", 30) + 60)
        return call

    def close(self):
        try:
            self.conn.send(("exit",))
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


@pytest.fixture(scope="module")
def model_dir():
    with tempfile.TemporaryDirectory(prefix="hixl-vllm-model-") as d:
        yield node.write_model_dir(d)


@pytest.fixture(scope="module", params=["shm", "tcp"])
def pd(request, model_dir):
    """A prefill (kv_producer) and a decode (kv_consumer) instance."""
    extra = {"transport": request.param, "lease_ms": LEASE_MS}
    p = Peer(model_dir, "kv_producer", extra)
    d = Peer(model_dir, "kv_consumer", dict(extra, link_timeout_ms=3000))
    try:
        p.ready()
        d.ready()
        yield p, d
    finally:
        p.close()
        d.close()


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


def test_kv_layouts_are_described_or_refused():
    import torch
    from llm_datadist.vllm_connector._worker import (LayoutError, describe_kv_caches,
                                                     layout_mismatch)
    nb = 8
    cpu = {"l0": torch.zeros(nb, 2, 16, 64), "l1": torch.zeros(nb, 2, 16, 64)}
    regions, layout = describe_kv_caches(cpu, ["l0", "l1"], nb)
    assert len(regions) == 2 and layout["block_bytes"] == 2 * 16 * 64 * 4
    assert regions[0][0] == cpu["l0"].data_ptr()
    split = {"l0": torch.zeros(2, nb, 16, 2, 32)}          # K and V apart (flash-attn style)
    regions, layout2 = describe_kv_caches(split, ["l0"], nb)
    assert len(regions) == 2 and layout2["split_kv"]
    assert regions[1][0] == split["l0"][1].data_ptr()
    mla = {"l0": torch.zeros(nb, 16, 576, dtype=torch.bfloat16)}  # MLA: one latent per token
    _, layout3 = describe_kv_caches(mla, ["l0"], nb)
    assert layout3["block_bytes"] == 16 * 576 * 2
    with pytest.raises(LayoutError, match="neither its first dimension"):
        describe_kv_caches({"l0": torch.zeros(3, 5)}, ["l0"], nb)
    with pytest.raises(LayoutError, match="not contiguous inside"):
        describe_kv_caches({"l0": torch.zeros(nb, 2, 16, 64)[:, :, :, :32]}, ["l0"], nb)
    cross = torch.zeros(nb, 2, 16, 64)        # blocks of both layers' pages (cross-layer)
    with pytest.raises(LayoutError, match="shared across layers are not supported yet"):
        describe_kv_caches({"l0": cross[:, 0], "l1": cross[:, 1]}, ["l0", "l1"], nb)
    with pytest.raises(LayoutError, match="differ"):
        describe_kv_caches({"a": torch.zeros(nb, 4), "b": torch.zeros(nb, 8)}, ["a", "b"], nb)
    assert layout_mismatch(layout, layout) == ""
    assert "block_shape" in layout_mismatch(layout, layout3)


def test_worker_handshake_and_shutdown_twice(model_dir):
    n = node.Node(model_dir, "kv_both", {"transport": "tcp", "listen_port": "0"})
    meta = n.worker.get_handshake_metadata()
    assert meta.address.startswith("127.0.0.1:") and meta.tp_rank == 0
    assert meta.layout["regions"] == node.NUM_LAYERS and meta.layout["split_kv"] is False
    with pytest.raises(RuntimeError, match="called twice"):
        n.worker.register_kv_caches(n.kv)
    n.worker.shutdown()
    n.worker.shutdown()


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
    assert_idle(p)


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


def test_prefill_abort_offers_nothing(pd):
    p, _ = pd
    p.add("ab3", prompt(22, 300), {"do_remote_decode": True}, 1)
    p.abort("ab3")
    out = p.run(until=["ab3"], idle=True)
    assert out["ab3"] is None
    assert_idle(p)


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


def test_layout_mismatch_is_refused_with_a_clear_error(pd):
    p, d = pd
    toks = prompt(41, 20)
    params = prefill(p, "lay", toks)
    layout = dict(params["hixl"]["layout"], block_shape=[2, 16, 128])
    d.add("lay", toks, dict(params, hixl=dict(params["hixl"], layout=layout)), 2)
    d.run(until=["lay"], idle=True)
    s = assert_idle(d)
    assert s["load_errors"]
    assert any("KV layout differs" in e and "block_shape" in e for e in s["errors"]), s["errors"]
    p.run(idle=True, timeout=LEASE_MS / 1000.0 + 20)
    assert_idle(p)


def test_malformed_params_are_computed_locally(pd):
    _, d = pd
    toks = prompt(42, 20)
    d.add("junk", toks, {"do_remote_prefill": True, "remote_block_ids": "all"}, 2)
    d.run(until=["junk"], idle=True)
    s = assert_idle(d)
    assert s["load_errors"] == []          # nothing was read: nothing to report
    assert "junk" in s["finished"]


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
