"""pytest tests of the Python package llm_datadist. This process and a second
one (tests/ldd_peer.py, driven over its stdin) link, register caches of numpy
arrays and CPU torch tensors, pull and push blocks and whole caches (every
byte compared), run a layer-wise transfer_cache_async whose synchronizer
fills each layer just before allowing it, check that failures raise
LLMException with the right status code, read transfer events, and hand KV
caches over through KVCachePublisher / KVCacheSubscriber (the seed's snippet
runs verbatim in a third process)."""
import base64
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import llm_datadist as ldd

PEER = os.path.join(os.path.dirname(__file__), "ldd_peer.py")
S = ldd.LLMStatusCode
PROMPT_ID = 1      # the peer's cluster id
DECODER_ID = 2     # this process's linked instance


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def raw(a):
    return np.ascontiguousarray(a).tobytes()


class PeerError(Exception):
    def __init__(self, reply):
        super().__init__(reply.get("err"))
        self.code = reply.get("code")


class Peer:
    """tests/ldd_peer.py in a second process; every wait is bounded."""

    def __init__(self):
        self.p = subprocess.Popen([sys.executable, PEER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def send(self, **req):
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()

    def reply(self, timeout=30):
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "the peer did not answer in %s s" % timeout
        line = self.p.stdout.readline()
        assert line, "the peer exited (rc %s)" % self.p.poll()
        out = json.loads(line)
        if "err" in out:
            raise PeerError(out)
        return out["ok"]

    def ex(self, src, timeout=30):
        self.send(exec=src)
        return self.reply(timeout)

    def ev(self, expr, timeout=30):
        self.send(eval=expr)
        return self.reply(timeout)

    def arrays(self, expr, dtype, shape):
        return [np.frombuffer(base64.b64decode(s), dtype=dtype).reshape(shape)
                for s in self.ev("b64(%s)" % expr)]

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=10)
            except Exception:
                self.p.kill()
                self.p.wait()
        self.p.stdout.close()


@pytest.fixture(scope="module")
def prompt():
    """The peer: a PROMPT instance (cluster 1) listening on a free port."""
    peer = Peer()
    try:
        peer.ex("""
dd = ldd.LLMDataDist(ldd.LLMRole.PROMPT, %d)
cfg = ldd.LLMConfig()
cfg.listen_ip_info = "127.0.0.1:0"
cfg.enable_cache_manager = True
cfg.enable_remote_cache_accessible = True
dd.init(cfg.generate_options())
cm = dd.cache_manager
""" % PROMPT_ID)
        peer.port = peer.ev("port_of(dd)")
        assert peer.port > 0
        yield peer
    finally:
        if peer.p.poll() is None:
            peer.p.kill()
            peer.p.wait()
        peer.p.stdout.close()


def cluster_info(cluster_id, port):
    c = ldd.LLMClusterInfo()
    c.remote_cluster_id = cluster_id
    c.remote_role_type = ldd.LLMRole.PROMPT
    c.append_local_ip_info("127.0.0.1", 0)
    c.append_remote_ip_info("127.0.0.1", port)
    return c


@pytest.fixture(scope="module")
def decoder(prompt):
    """This process's DECODER instance (cluster 2), linked to the peer."""
    dd = ldd.LLMDataDist(ldd.LLMRole.DECODER, DECODER_ID)
    dd.init(ldd.LLMConfig().generate_options())
    ret, rets = dd.link_clusters([cluster_info(PROMPT_ID, prompt.port)], timeout=5000)
    assert ret == S.LLM_SUCCESS and rets == [S.LLM_SUCCESS]
    yield dd
    dd.finalize()


# --------------------------------------------------------------------- no peer

def test_config_enums_and_types():
    cfg = ldd.LLMConfig()
    assert ldd.LlmConfig is ldd.LLMConfig
    assert cfg.generate_options() == {}
    cfg.listen_ip_info = "127.0.0.1:26000"
    cfg.sync_kv_timeout = 2000
    cfg.device_id = 0
    cfg.enable_switch_role = True
    cfg.transfer_backend = "hixl"
    cfg.global_resource_config = {"LinkType": "TCP"}
    cfg.cache_lease_ms = 500
    cfg.share_caches_by_mapping = True
    cfg.enable_cache_manager = True
    cfg.enable_remote_cache_accessible = True
    assert cfg.generate_options() == {
        "llm.ListenIpInfo": "127.0.0.1:26000", "llm.SyncKvCacheWaitTime": "2000",
        "llm.DeviceId": "0", "llm.EnableSwitchRole": "1", "llm.TransferBackend": "hixl",
        "llm.GlobalResourceConfig": '{"LinkType": "TCP"}', "llm.CacheLeaseMs": "500",
        "llm.ShareCachesByMapping": "1"}
    with pytest.raises(AttributeError):
        cfg.no_such_option = 1
    cfg.listen_ip_info = "nonsense"
    with pytest.raises(ldd.LLMException) as ei:
        cfg.generate_options()
    assert ei.value.status_code == S.LLM_PARAM_INVALID

    assert (ldd.LLMRole.PROMPT, ldd.LLMRole.DECODER, ldd.LLMRole.MIX) == (1, 2, 3)
    assert (ldd.Placement.HOST, ldd.Placement.DEVICE) == (0, 1)
    assert (ldd.DataType.DT_FLOAT, ldd.DataType.DT_FLOAT16, ldd.DataType.DT_INT8,
            ldd.DataType.DT_BF16) == (0, 1, 2, 27)
    assert S.LLM_PARAM_INVALID == 0x5010B005 and S.LLM_FAILED == 0xFFFFFFFF
    assert {c.name for c in S} >= {
        "LLM_SUCCESS", "LLM_FAILED", "LLM_WAIT_PROC_TIMEOUT", "LLM_KV_CACHE_NOT_EXIST",
        "LLM_PARAM_INVALID", "LLM_NOT_YET_LINK", "LLM_ALREADY_LINK", "LLM_LINK_FAILED",
        "LLM_UNLINK_FAILED", "LLM_CLUSTER_NUM_EXCEED_LIMIT", "LLM_PROCESSING_LINK",
        "LLM_EXIST_LINK", "LLM_FEATURE_NOT_ENABLED", "LLM_TIMEOUT", "LLM_OUT_OF_MEMORY"}
    for c in S:
        assert ldd._llm_datadist.status_code_name(int(c)) == c.name

    c = ldd.LLMClusterInfo()
    c.append_remote_ip_info(0x0100007F, 26000)     # little-endian octets: 127.0.0.1
    c.append_local_ip_info("::1", 0)
    assert c.remote_ip_infos == [("127.0.0.1", 26000)] and c.local_ip_infos == [("::1", 0)]
    with pytest.raises(ldd.LLMException) as ei:
        c.append_remote_ip_info("not-an-ip", 1)
    assert ei.value.status_code == S.LLM_PARAM_INVALID

    e = ldd.LLMException("boom", S.LLM_TIMEOUT)
    assert isinstance(e, Exception) and e.status_code is S.LLM_TIMEOUT and str(e) == "boom"
    assert ldd.CacheKey(1, 2) == ldd.CacheKey(1, 2, 0) and len({ldd.CacheKey(1, 2),
                                                                 ldd.CacheKey(1, 2)}) == 1
    d = ldd.CacheDesc(2, [4, 8], ldd.DataType.DT_FLOAT16)
    assert d.placement == ldd.Placement.DEVICE and d.tensor_size == 64
    for bad in ([0, 8], [], "x"):
        with pytest.raises(ldd.LLMException):
            ldd.CacheDesc(2, bad, ldd.DataType.DT_FLOAT16)
    with pytest.raises(ldd.LLMException):
        ldd.CacheDesc(2, [4], 99)


def test_host_memory_and_options_accepted():
    m = ldd.allocate_host_memory(10000)
    a = np.asarray(m)
    assert a.dtype == np.uint8 and a.shape == (10000,) and m.size == len(m) == 10000
    assert m.address == a.ctypes.data and m.address % 4096 == 0
    a[:] = 7
    assert memoryview(m)[9999] == 7
    # The options generate_options writes are accepted by the C++ layer.
    cfg = ldd.LLMConfig()
    cfg.listen_ip_info = "127.0.0.1:0"
    cfg.sync_kv_timeout = 2000
    cfg.device_id = 0
    cfg.enable_switch_role = True
    cfg.transfer_backend = "hixl"
    cfg.global_resource_config = {"LinkType": "TCP"}
    cfg.cache_lease_ms = 0
    cfg.share_caches_by_mapping = True
    with ldd.LLMDataDist(ldd.LLMRole.MIX, 40) as dd:
        dd.init(cfg.generate_options())
        assert dd.local_address.startswith("127.0.0.1:") and dd.cluster_id == 40
        dd.switch_role(ldd.LLMRole.PROMPT)
        assert dd.role == ldd.LLMRole.PROMPT
        cache = dd.cache_manager.register_cache(
            ldd.CacheDesc(1, [2, 5000], ldd.DataType.DT_UINT8, ldd.Placement.HOST), [m])
        assert cache.cache_id >= 1 and cache.tensor_addrs == [m.address]
        dd.cache_manager.unregister_cache(cache.cache_id)
        # A registered object is held (its buffer export too) until unregistered.
        ba = bytearray(10000)
        cache = dd.cache_manager.register_cache(
            ldd.CacheDesc(1, [2, 5000], ldd.DataType.DT_UINT8, ldd.Placement.HOST), [ba])
        with pytest.raises(BufferError):
            ba.extend(b"x")
        dd.cache_manager.unregister_cache(cache)
        ba.extend(b"x")
        arr = np.full(10000, 3, np.uint8)
        cache = dd.cache_manager.register_cache(
            ldd.CacheDesc(1, [2, 5000], ldd.DataType.DT_UINT8, ldd.Placement.HOST), [arr])
        del arr
        assert bytes(ldd._llm_datadist.view(cache.tensor_addrs[0], 10000)) == b"\x03" * 10000
    with pytest.raises(ldd.LLMException) as ei:
        ldd.LLMDataDist(ldd.LLMRole.DECODER, 41).init({"llm.NoSuchOption": "1"})
    assert ei.value.status_code == S.LLM_PARAM_INVALID
    with ldd.LLMDataDist(ldd.LLMRole.DECODER, 42) as dd:
        dd.init({})
        with pytest.raises(ldd.LLMException) as ei:
            dd.switch_role(ldd.LLMRole.PROMPT)     # enable_switch_role was not set
        assert ei.value.status_code == S.LLM_FEATURE_NOT_ENABLED


def test_authenticated_clusters(tmp_path):
    """The engine's AuthSecretFile through llm.GlobalResourceConfig: clusters with
    the secret link and pull; one without it is refused (LLM_LINK_FAILED)."""
    path = tmp_path / "secret"
    path.write_text("datadist shared secret\n")
    path.chmod(0o600)

    def config(listen, secret):
        cfg = ldd.LLMConfig()
        if listen:
            cfg.listen_ip_info = "127.0.0.1:0"
            cfg.enable_cache_manager = True
            cfg.enable_remote_cache_accessible = True
        if secret:
            cfg.global_resource_config = {"AuthSecretFile": str(path)}
        return cfg.generate_options()

    desc = ldd.CacheDesc(2, [4, 64], ldd.DataType.DT_UINT8, ldd.Placement.HOST)
    with ldd.LLMDataDist(ldd.LLMRole.PROMPT, 60) as p, \
            ldd.LLMDataDist(ldd.LLMRole.DECODER, 61) as d, \
            ldd.LLMDataDist(ldd.LLMRole.DECODER, 62) as stranger:
        p.init(config(True, True))
        d.init(config(False, True))
        stranger.init(config(False, False))
        src = [np.arange(256, dtype=np.uint8).reshape(4, 64), np.full((4, 64), 9, np.uint8)]
        cache = p.cache_manager.register_cache(desc, src, [ldd.CacheKey(60, 7)])
        port = int(p.local_address.rsplit(":", 1)[1])
        ret, rets = d.link_clusters([cluster_info(60, port)], timeout=3000)
        assert ret == S.LLM_SUCCESS and rets == [S.LLM_SUCCESS]
        dst = [np.zeros((4, 64), np.uint8) for _ in range(2)]
        local = d.cache_manager.register_cache(desc, dst)
        d.cache_manager.pull_cache(ldd.CacheKey(60, 7), local)
        # A key names one batch entry (row 0 here): that row arrives.
        assert all((a[0] == b[0]).all() for a, b in zip(dst, src))
        ret, rets = stranger.link_clusters([cluster_info(60, port)], timeout=3000)
        assert rets == [S.LLM_LINK_FAILED]
        d.cache_manager.unregister_cache(local.cache_id)
        p.cache_manager.unregister_cache(cache.cache_id)


def test_lease_expiry_event():
    with ldd.LLMDataDist(ldd.LLMRole.PROMPT, 43) as dd:
        dd.init({})
        cm = dd.cache_manager
        a = np.zeros((2, 64), np.uint8)
        cache = cm.register_cache(ldd.CacheDesc(1, [2, 64], ldd.DataType.DT_UINT8), [a],
                                  [ldd.CacheKey(43, 5), ldd.CacheKey(43, 6)], lease_ms=30)
        evs = []
        deadline = time.monotonic() + 5
        while len(evs) < 1 and time.monotonic() < deadline:
            evs += cm.get_transfer_events()
            time.sleep(0.005)
        assert evs and evs[0].kind == ldd.TransferEventKind.LEASE_EXPIRED
        assert evs[0].cache_id == cache.cache_id and evs[0].peer_cluster_id == 0
        assert evs[0].key in (ldd.CacheKey(43, 5), ldd.CacheKey(43, 6))


# --------------------------------------------------------------------- blocks

KV_LAYERS, BLOCKS, BLOCK_ELEMS = 3, 16, 512      # 6 tensors of 16 blocks of 1 KiB


def test_blocks_numpy(prompt, decoder):
    prompt.ex("""
bdesc = ldd.CacheDesc(6, [16, 512], ldd.DataType.DT_FLOAT16, ldd.Placement.HOST)
bsrc = [pattern(16 * 1024, 100 + i).view(np.float16).reshape(16, 512) for i in range(6)]
bcache = cm.register_blocks_cache(bdesc, bsrc, ldd.BlocksCacheKey(%d, 0))
""" % PROMPT_ID)
    remote = [pattern(16 * 1024, 100 + i).view(np.float16).reshape(16, 512) for i in range(6)]
    cm = decoder.cache_manager
    dst = [np.zeros((8, 512), np.float16) for _ in range(6)]
    local = cm.register_blocks_cache(ldd.CacheDesc(6, [8, 512], ldd.DataType.DT_FLOAT16), dst)
    assert local.tensor_addrs == [a.ctypes.data for a in dst]

    cm.pull_blocks(ldd.BlocksCacheKey(PROMPT_ID, 0), local, src_blocks=[3, 4, 5, 9],
                   dst_blocks=[0, 1, 2, 7])
    for i in range(6):
        want = np.zeros((8, 512), np.float16)
        want[[0, 1, 2, 7]] = remote[i][[3, 4, 5, 9]]
        assert raw(dst[i]) == raw(want)

    # The same cache by id; only layer 1 (tensors 2 and 3) of block 15 -> 6.
    bid = prompt.ev("bcache.cache_id")
    cm.pull_blocks(ldd.CacheKeyByIdAndIndex(PROMPT_ID, bid), local, [15], [6],
                   src_layer_range=range(1, 2), dst_layer_range=range(1, 2))
    for i in range(6):
        want = raw(remote[i][15]) if i in (2, 3) else bytes(1024)
        assert raw(dst[i][6]) == want

    # Pushes: blocks 0, 1 -> 14, 15 of every tensor; then layer 2 only, 3 -> 13.
    for i in range(6):
        dst[i][:] = pattern(8 * 1024, 300 + i).view(np.float16).reshape(8, 512)
    cm.push_blocks(ldd.BlocksCacheKey(PROMPT_ID, 0), local, src_blocks=[0, 1], dst_blocks=[14, 15])
    cm.push_blocks(ldd.BlocksCacheKey(PROMPT_ID, 0), local, [3], [13],
                   src_layer_range=range(2, 3), dst_layer_range=range(2, 3))
    got = prompt.arrays("bsrc", np.float16, (16, 512))
    for i in range(6):
        want = remote[i].copy()
        want[[14, 15]] = dst[i][[0, 1]]
        if i in (4, 5):
            want[13] = dst[i][3]
        assert raw(got[i]) == raw(want)
    cm.unregister_cache(local.cache_id)
    prompt.ex("cm.unregister_cache(bcache.cache_id)")


def test_blocks_torch(prompt, decoder):
    torch = pytest.importorskip("torch")
    prompt.ex("""
tsrc = [pattern(16 * 1024, 500 + i).view(np.uint16).reshape(16, 512) for i in range(4)]
tcache = cm.register_blocks_cache(ldd.CacheDesc(4, [16, 512], ldd.DataType.DT_BF16),
                                  tsrc, ldd.BlocksCacheKey(%d, 1))
""" % PROMPT_ID)
    remote = [pattern(16 * 1024, 500 + i).reshape(16, 1024) for i in range(4)]

    def tb(t):  # the tensor's bytes
        return t.contiguous().view(torch.uint8).numpy().tobytes()

    cm = decoder.cache_manager
    dst = [torch.zeros(4, 512, dtype=torch.bfloat16) for _ in range(4)]
    local = cm.register_blocks_cache(ldd.CacheDesc(4, [4, 512], ldd.DataType.DT_BF16), dst)
    assert local.tensor_addrs == [t.data_ptr() for t in dst]
    cm.pull_blocks(ldd.BlocksCacheKey(PROMPT_ID, 1), local, [10, 11, 12, 0], [0, 1, 2, 3])
    for i in range(4):
        assert tb(dst[i]) == raw(remote[i][[10, 11, 12, 0]])
    for i in range(4):
        dst[i].view(torch.uint8).copy_(torch.from_numpy(pattern(4 * 1024, 600 + i).reshape(4, 1024)))
    cm.push_blocks(ldd.BlocksCacheKey(PROMPT_ID, 1), local, [2, 3], [5, 6])
    got = prompt.arrays("tsrc", np.uint8, (16, 1024))
    for i in range(4):
        want = remote[i].copy()
        want[[5, 6]] = pattern(4 * 1024, 600 + i).reshape(4, 1024)[[2, 3]]
        assert raw(got[i]) == raw(want)
    # Int addresses of tensors work too (the caller keeps them alive).
    keep = [torch.zeros(4, 512, dtype=torch.bfloat16) for _ in range(4)]
    c2 = cm.register_blocks_cache(ldd.CacheDesc(4, [4, 512], ldd.DataType.DT_BF16),
                                  [t.data_ptr() for t in keep])
    cm.pull_blocks(ldd.CacheKeyByIdAndIndex(PROMPT_ID, prompt.ev("tcache.cache_id")), c2, [7], [1])
    assert tb(keep[3][1]) == raw(remote[3][7])
    cm.unregister_cache(c2.cache_id)
    # A non-contiguous tensor is refused.
    with pytest.raises(ldd.LLMException) as ei:
        cm.register_blocks_cache(ldd.CacheDesc(1, [4, 512], ldd.DataType.DT_BF16),
                                 [torch.zeros(512, 4, dtype=torch.bfloat16).t()])
    assert ei.value.status_code == S.LLM_PARAM_INVALID and "contiguous" in str(ei.value)
    cm.unregister_cache(local.cache_id)
    prompt.ex("cm.unregister_cache(tcache.cache_id)")


# --------------------------------------------------------------------- whole caches

def test_pull_push_cache(prompt, decoder):
    prompt.ex("""
w = [pattern(3 * 1024, 200 + i).view(np.int32).reshape(3, 256) for i in range(4)]
whole = cm.register_cache(ldd.CacheDesc(4, [3, 256], ldd.DataType.DT_INT32), w,
                          [ldd.CacheKey(%d, 100), ldd.CacheKey(%d, 101), ldd.CacheKey(%d, 102)])
""" % (PROMPT_ID, PROMPT_ID, PROMPT_ID))
    wid = prompt.ev("whole.cache_id")
    remote = [pattern(3 * 1024, 200 + i).view(np.int32).reshape(3, 256) for i in range(4)]
    cm = decoder.cache_manager
    loc = [np.zeros((2, 256), np.int32) for _ in range(4)]
    cache = cm.register_cache(ldd.CacheDesc(4, [2, 256], ldd.DataType.DT_INT32), loc)

    cm.pull_cache(ldd.CacheKey(PROMPT_ID, 101), cache, batch_index=1)   # key 101: batch 1
    for i in range(4):
        assert raw(loc[i][1]) == raw(remote[i][1]) and not loc[i][0].any()
    # Batch 2 by id, layer 1 only (tensors 2, 3), into batch 0.
    cm.pull_cache(ldd.CacheKeyByIdAndIndex(PROMPT_ID, wid, 2), cache, batch_index=0,
                  src_layer_range=range(1, 2), dst_layer_range=range(1, 2))
    for i in range(4):
        assert raw(loc[i][0]) == (raw(remote[i][2]) if i >= 2 else bytes(1024))
    # size: the first 64 bytes of batch 0, layer 0.
    cm.pull_cache(ldd.CacheKeyByIdAndIndex(PROMPT_ID, wid, 0), cache, 0, 64,
                  src_layer_range=range(0, 1), dst_layer_range=range(0, 1))
    for i in range(2):
        assert raw(loc[i][0][:16]) == raw(remote[i][0][:16]) and not loc[i][0][16:].any()

    # Pushes: our batch 1 -> their batch 0; our batch 0, layer 0 -> key 102's layer 1.
    cm.push_cache(ldd.CacheKeyByIdAndIndex(PROMPT_ID, wid, 0), cache, src_batch_index=1)
    cm.push_cache(ldd.CacheKey(PROMPT_ID, 102), cache, src_batch_index=0,
                  src_layer_range=range(0, 1), dst_layer_range=range(1, 2))
    got = prompt.arrays("w", np.int32, (3, 256))
    for i in range(4):
        want = remote[i].copy()
        want[0] = loc[i][1]
        if i >= 2:
            want[2] = loc[i - 2][0]
        assert raw(got[i]) == raw(want)
    cm.unregister_cache(cache.cache_id)
    prompt.ex("cm.unregister_cache(whole.cache_id)")


# --------------------------------------------------------------------- layer-wise

class FillingSynchronizer(ldd.LayerSynchronizer):
    """Fills layer i of the source just before letting it move (as a model
    whose compute of layer i ends right then)."""

    def __init__(self, src, fail_at=None):
        self.src, self.fail_at, self.calls = src, fail_at, []

    def synchronize_layer(self, layer_index, timeout_in_millis):
        self.calls.append(layer_index)
        if layer_index == self.fail_at:
            return False
        for t in (2 * layer_index, 2 * layer_index + 1):
            self.src[t][:] = pattern(self.src[t].size, 700 + t).reshape(self.src[t].shape)
        return True


def test_transfer_cache_async(prompt, decoder):
    prompt.ex("""
A = [np.zeros((1, 1024), np.uint8) for _ in range(6)]
ca = cm.register_cache(ldd.CacheDesc(6, [1, 1024], ldd.DataType.DT_UINT8), A)
B = [np.zeros((2, 1024), np.uint8) for _ in range(6)]
cb = cm.register_cache(ldd.CacheDesc(6, [2, 1024], ldd.DataType.DT_UINT8), B,
                       [ldd.CacheKey(%d, 300), ldd.CacheKey(%d, 301)])
""" % (PROMPT_ID, PROMPT_ID))
    dst_addrs = prompt.ev("ca.tensor_addrs")
    cm = decoder.cache_manager
    src = [np.zeros((1, 1024), np.uint8) for _ in range(6)]
    cache = cm.register_cache(ldd.CacheDesc(6, [1, 1024], ldd.DataType.DT_UINT8), src)
    sync = FillingSynchronizer(src)
    task = cm.transfer_cache_async(
        cache, sync, [ldd.TransferConfig(PROMPT_ID, dst_addrs, range(0, 3), 0),
                      ldd.TransferWithCacheKeyConfig(ldd.CacheKey(PROMPT_ID, 301))])
    assert task.synchronize(timeout_in_millis=10000) == S.LLM_SUCCESS
    assert task.get_results() == [S.LLM_SUCCESS, S.LLM_SUCCESS]
    assert sync.calls == [0, 1, 2]
    want = [raw(pattern(1024, 700 + t)) for t in range(6)]
    assert [raw(a) for a in prompt.arrays("A", np.uint8, (1, 1024))] == want
    got_b = prompt.arrays("B", np.uint8, (2, 1024))
    assert [raw(b[1]) for b in got_b] == want and not any(b[0].any() for b in got_b)

    # A synchronizer that refuses layer 1: the task fails, layer 2 never moves.
    prompt.ex("for a in A: a[:] = 0")
    for a in src:
        a[:] = 0
    sync = FillingSynchronizer(src, fail_at=1)
    task = cm.transfer_cache_async(cache, sync, [ldd.TransferConfig(PROMPT_ID, dst_addrs)])
    with pytest.raises(ldd.LLMException):
        task.synchronize(timeout_in_millis=10000)
    assert task.get_results()[0] != S.LLM_SUCCESS
    assert sync.calls == [0, 1]
    got = prompt.arrays("A", np.uint8, (1, 1024))
    assert raw(got[0]) == want[0] and not got[4].any() and not got[5].any()
    cm.unregister_cache(cache.cache_id)
    prompt.ex("cm.unregister_cache(ca.cache_id); cm.unregister_cache(cb.cache_id)")


def test_layer_gates_let_layers_through_one_by_one(prompt, decoder):
    """LayerGates (waited for in C++, no Python call per layer): layer i
    moves once open(i) was called; open_all() lets the rest through; fail()
    fails the task with the layers not yet moved left untouched."""
    import time
    prompt.ex("""
A = [np.zeros((1, 1024), np.uint8) for _ in range(6)]
ca = cm.register_cache(ldd.CacheDesc(6, [1, 1024], ldd.DataType.DT_UINT8), A)
""")
    dst_addrs = prompt.ev("ca.tensor_addrs")
    cm = decoder.cache_manager
    src = [pattern(1024, 900 + t).reshape(1, 1024) for t in range(6)]
    cache = cm.register_cache(ldd.CacheDesc(6, [1, 1024], ldd.DataType.DT_UINT8), src)
    gates = ldd.LayerGates(3)
    task = cm.transfer_cache_async(cache, gates, [ldd.TransferConfig(PROMPT_ID, dst_addrs)])
    gates.open(0)
    deadline, landed = time.monotonic() + 10, False
    while not landed and time.monotonic() < deadline:
        landed = raw(prompt.arrays("A", np.uint8, (1, 1024))[1]) == raw(src[1])
    assert landed and not task.done()
    got = prompt.arrays("A", np.uint8, (1, 1024))
    assert not got[2].any() and not got[5].any()          # layers 1 and 2 wait
    gates.open_all()
    assert task.synchronize(timeout_in_millis=10000) == S.LLM_SUCCESS
    assert [raw(a) for a in prompt.arrays("A", np.uint8, (1, 1024))] == [raw(t) for t in src]
    assert gates.early == 1
    # fail(): the layers still waiting fail the task and never move.
    prompt.ex("for a in A: a[:] = 0")
    gates = ldd.LayerGates(3)
    task = cm.transfer_cache_async(cache, gates, [ldd.TransferConfig(PROMPT_ID, dst_addrs)])
    gates.fail()
    with pytest.raises(ldd.LLMException):
        task.synchronize(timeout_in_millis=10000)
    assert not any(a.any() for a in prompt.arrays("A", np.uint8, (1, 1024)))
    with pytest.raises(ldd.LLMException):
        cm.transfer_cache_async(cache, object(), [ldd.TransferConfig(PROMPT_ID, dst_addrs)])
    cm.unregister_cache(cache.cache_id)
    prompt.ex("cm.unregister_cache(ca.cache_id)")


# --------------------------------------------------------------------- errors

def test_errors_raise_llm_exception(prompt, decoder):
    prompt.ex("""
e_src = [np.zeros((4, 256), np.uint8) for _ in range(2)]
e_cache = cm.register_blocks_cache(ldd.CacheDesc(2, [4, 256], ldd.DataType.DT_UINT8), e_src,
                                   ldd.BlocksCacheKey(%d, 9))
""" % PROMPT_ID)
    cm = decoder.cache_manager
    loc = [np.zeros((4, 256), np.uint8) for _ in range(2)]
    local = cm.register_blocks_cache(ldd.CacheDesc(2, [4, 256], ldd.DataType.DT_UINT8), loc)

    def code_of(fn, *a, **kw):
        with pytest.raises(ldd.LLMException) as ei:
            fn(*a, **kw)
        assert str(ei.value)
        return ei.value.status_code

    # Unknown remote caches and keys.
    assert code_of(cm.pull_blocks, ldd.CacheKeyByIdAndIndex(PROMPT_ID, 9999), local, [0], [0]) == \
        S.LLM_KV_CACHE_NOT_EXIST
    assert code_of(cm.pull_blocks, ldd.BlocksCacheKey(PROMPT_ID, 77), local, [0], [0]) == \
        S.LLM_KV_CACHE_NOT_EXIST
    assert code_of(cm.pull_cache, ldd.CacheKey(PROMPT_ID, 55555), local) == S.LLM_KV_CACHE_NOT_EXIST
    # Not linked.
    assert code_of(cm.pull_blocks, ldd.BlocksCacheKey(77, 9), local, [0], [0]) == S.LLM_NOT_YET_LINK
    # Blocks out of range, remote and local; nothing moves.
    assert code_of(cm.pull_blocks, ldd.BlocksCacheKey(PROMPT_ID, 9), local, [1000], [0]) == \
        S.LLM_PARAM_INVALID
    assert code_of(cm.push_blocks, ldd.BlocksCacheKey(PROMPT_ID, 9), local, [0], [4]) == \
        S.LLM_PARAM_INVALID
    assert code_of(cm.pull_blocks, ldd.BlocksCacheKey(PROMPT_ID, 9), local, [0], [99]) == \
        S.LLM_PARAM_INVALID
    # Layer ranges: a step other than 1, or out of the cache.
    assert code_of(cm.pull_blocks, ldd.BlocksCacheKey(PROMPT_ID, 9), local, [0], [0],
                   src_layer_range=range(0, 4, 2)) == S.LLM_PARAM_INVALID
    assert code_of(cm.pull_blocks, ldd.BlocksCacheKey(PROMPT_ID, 9), local, [0], [0],
                   src_layer_range=range(3, 5), dst_layer_range=range(3, 5)) == S.LLM_PARAM_INVALID
    # Wrong key kinds and objects.
    assert code_of(cm.pull_blocks, ldd.CacheKey(PROMPT_ID, 1), local, [0], [0]) == \
        S.LLM_PARAM_INVALID
    assert code_of(cm.pull_cache, ldd.CacheKeyByIdAndIndex(PROMPT_ID, 1), "not a cache") == \
        S.LLM_PARAM_INVALID
    # Memory that cannot be registered.
    desc = ldd.CacheDesc(1, [4, 256], ldd.DataType.DT_UINT8)
    assert code_of(cm.register_cache, desc, [np.zeros(100, np.uint8)]) == S.LLM_PARAM_INVALID
    assert code_of(cm.register_cache, desc, [np.zeros((256, 8), np.uint8).T]) == \
        S.LLM_PARAM_INVALID
    ro = np.zeros((4, 256), np.uint8)
    ro.flags.writeable = False
    assert code_of(cm.register_cache, desc, [ro]) == S.LLM_PARAM_INVALID
    assert code_of(cm.register_cache, desc, [np.zeros((4, 256), np.uint8)] * 2) == \
        S.LLM_PARAM_INVALID
    assert code_of(cm.register_cache, desc, ["text"]) == S.LLM_PARAM_INVALID
    assert code_of(cm.unregister_cache, 123456) != S.LLM_SUCCESS
    # Links: again, wrong cluster id, unlink of a cluster never linked.
    ret, rets = decoder.link_clusters([cluster_info(PROMPT_ID, prompt.port)])
    assert rets == [S.LLM_ALREADY_LINK]
    other = ldd.LLMDataDist(ldd.LLMRole.DECODER, 3)
    other.init({})
    ret, rets = other.link_clusters([cluster_info(PROMPT_ID + 50, prompt.port)], timeout=3000)
    assert ret != S.LLM_SUCCESS and rets == [S.LLM_LINK_FAILED]
    ret, rets = other.unlink_clusters([cluster_info(PROMPT_ID, prompt.port)])
    assert rets == [S.LLM_NOT_YET_LINK]
    assert code_of(other.link_clusters, ["not a cluster"]) == S.LLM_PARAM_INVALID
    other.finalize()
    assert code_of(other.cache_manager.register_cache, desc, [np.zeros((4, 256), np.uint8)]) != \
        S.LLM_SUCCESS
    cm.unregister_cache(local.cache_id)
    prompt.ex("cm.unregister_cache(e_cache.cache_id)")


# --------------------------------------------------------------------- events

def test_events_after_pull_and_push(prompt, decoder):
    prompt.ex("""
cm.get_transfer_events()
v_src = [pattern(8 * 512, 800 + i).reshape(8, 512) for i in range(2)]
v_cache = cm.register_blocks_cache(ldd.CacheDesc(2, [8, 512], ldd.DataType.DT_UINT8), v_src,
                                   ldd.BlocksCacheKey(%d, 2))
v_whole = cm.register_cache(ldd.CacheDesc(2, [2, 512], ldd.DataType.DT_UINT8),
                            [np.zeros((2, 512), np.uint8) for _ in range(2)],
                            [ldd.CacheKey(%d, 900), ldd.CacheKey(%d, 901)])
""" % (PROMPT_ID, PROMPT_ID, PROMPT_ID))
    vid, wid = prompt.ev("v_cache.cache_id"), prompt.ev("v_whole.cache_id")
    cm = decoder.cache_manager
    loc = [np.zeros((8, 512), np.uint8) for _ in range(2)]
    local = cm.register_blocks_cache(ldd.CacheDesc(2, [8, 512], ldd.DataType.DT_UINT8), loc)
    cm.pull_blocks(ldd.BlocksCacheKey(PROMPT_ID, 2), local, [1, 2], [0, 1], user_tag="req-42")
    assert raw(loc[1][:2]) == raw(pattern(8 * 512, 801).reshape(8, 512)[1:3])
    evs = prompt.ev("wait_events(cm, 1)")
    assert len(evs) == 1
    e = evs[0]
    assert e["kind"] == "PULLED" and e["peer_cluster_id"] == DECODER_ID and e["cache_id"] == vid
    assert sorted(e["blocks"]) == [1, 2] and e["user_tag"] == "req-42" and e["key"] is None

    wloc = [np.zeros((1, 512), np.uint8) for _ in range(2)]
    wcache = cm.register_cache(ldd.CacheDesc(2, [1, 512], ldd.DataType.DT_UINT8), wloc)
    cm.pull_cache(ldd.CacheKey(PROMPT_ID, 901), wcache, user_tag="by-key")
    e = prompt.ev("wait_events(cm, 1)")[0]
    assert e["kind"] == "PULLED" and e["key"] == [PROMPT_ID, 901, 0] and e["batch_index"] == 1
    assert e["cache_id"] == wid and e["user_tag"] == "by-key"

    # The callback setter: pushes arrive as PUSHED events, in order.
    prompt.ex("got = []; cm.set_transfer_callback(lambda ev: got.append(event_dict(ev)))")
    cm.push_blocks(ldd.BlocksCacheKey(PROMPT_ID, 2), local, [0], [7], user_tag="push-1")
    cm.push_cache(ldd.CacheKeyByIdAndIndex(PROMPT_ID, wid, 0), wcache,
                  src_layer_range=range(0, 1), dst_layer_range=range(0, 1), user_tag="push-2")
    got = prompt.ev("wait_until(lambda: len(got) >= 2) and got")
    assert [g["user_tag"] for g in got] == ["push-1", "push-2"]
    assert got[0]["kind"] == "PUSHED" and got[0]["blocks"] == [7]
    assert got[1]["batch_index"] == 0 and got[1]["layer_range"] == [0, 1]
    prompt.ex("cm.set_transfer_callback(None)")
    assert prompt.ev("len(cm.get_transfer_events())") == 0
    cm.unregister_cache(local.cache_id)
    cm.unregister_cache(wcache.cache_id)
    prompt.ex("cm.unregister_cache(v_cache.cache_id); cm.unregister_cache(v_whole.cache_id)")


# --------------------------------------------------------------------- the facade

SNIPPET = '''import llm_datadist as ldd
subscriber = ldd.KVCacheSubscriber()
subscriber.init(rank_id=0, local_ip="127.0.0.1", local_port=18000)
recv_buffer = ldd.allocate_host_memory(128 * 1024 * 1024)
subscriber.register_buffer(recv_buffer)
cache_id = ldd.CacheId(prompt_hash="abc123", seq_len=512)
result = subscriber.subscribe(cache_id, timeout_ms=5000)
if result.status == ldd.SUBSCRIBE_STATUS_SUCCESS:
    kv_cache_ptr = subscriber.get_cache_data(cache_id)   # the received bytes in the registered buffer, no copy
    print(f"Received KV Cache with {result.seq_len} tokens")
'''

SNIPPET_CHECK = '''
import hashlib
print("STATUS", result.status, flush=True)
if result.status == ldd.SUBSCRIBE_STATUS_SUCCESS:
    inside = recv_buffer.address <= kv_cache_ptr.address and \\
        kv_cache_ptr.address + kv_cache_ptr.size <= recv_buffer.address + recv_buffer.size
    print("INSIDE", inside, kv_cache_ptr.size, hashlib.sha256(memoryview(kv_cache_ptr)).hexdigest())
'''


def free_port(preferred):
    for port in (preferred, 0):
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            return s.getsockname()[1]
        except OSError:
            continue
        finally:
            s.close()


def test_subscriber_snippet_end_to_end():
    port = free_port(18000)
    code = SNIPPET if port == 18000 else SNIPPET.replace("local_port=18000", "local_port=%d" % port)
    sub = subprocess.Popen([sys.executable, "-c", code + SNIPPET_CHECK], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        pub = ldd.KVCachePublisher()
        pub.init(rank_id=0)
        assert pub.connect("127.0.0.1", port, remote_rank_id=0, timeout_ms=15000) == 0
        kv = pattern(512 * 2 * 1024 + 100, 7)       # a partial last block too
        pub.publish(ldd.CacheId(prompt_hash="abc123", seq_len=512), kv)
        out, err = sub.communicate(timeout=30)
        pub.finalize()
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    lines = out.splitlines()
    assert "Received KV Cache with 512 tokens" in lines
    assert "STATUS 0" in lines
    assert "INSIDE True %d %s" % (kv.size, hashlib.sha256(kv).hexdigest()) in lines


def test_publisher_subscriber_statuses_and_space(prompt):
    sub = ldd.KVCacheSubscriber()
    sub.init(rank_id=5, local_ip="127.0.0.1", local_port=0)
    try:
        assert sub.local_port > 0 and sub.cluster_id == 5
        buf = sub.allocate_host_memory(64 * 1024)        # 16 blocks of 4 KiB
        sub.register_buffer(buf)
        prompt.ex("pub = ldd.KVCachePublisher(); pub.init(rank_id=3); "
                  "pub.connect('127.0.0.1', %d, remote_rank_id=5)" % sub.local_port)
        r = sub.subscribe(ldd.CacheId("nothing", 1), timeout_ms=100)
        assert r.status == ldd.SUBSCRIBE_STATUS_TIMEOUT
        prompt.ex("pub.notify_not_found(ldd.CacheId('gone', 8))")
        r = sub.subscribe(ldd.CacheId("gone", 8), timeout_ms=5000)
        assert r.status == ldd.SUBSCRIBE_STATUS_NOT_FOUND

        def publish(name, seed, timeout_ms=5000):
            prompt.ex("pub.publish(ldd.CacheId(%r, 10), pattern(24 * 1024, %d).reshape(24, 1024), "
                      "timeout_ms=%d)" % (name, seed, timeout_ms), timeout=30)

        publish("p1", 1)
        publish("p2", 2)
        r = sub.subscribe(ldd.CacheId("p1", 10), timeout_ms=5000)
        assert r.status == ldd.SUBSCRIBE_STATUS_SUCCESS and r.size == 24 * 1024 and r.seq_len == 10
        assert r.descriptor == ldd.CacheDescriptor((24, 1024), np.uint8, ldd.Placement.HOST)
        d1 = sub.get_cache_data(ldd.CacheId("p1", 10))
        assert d1.address == buf.address and bytes(d1) == raw(pattern(24 * 1024, 1))
        # 12 of 16 blocks are held: a third publication waits, then fails.
        with pytest.raises(PeerError) as ei:
            publish("p3", 3, timeout_ms=300)
        assert ei.value.code == int(S.LLM_OUT_OF_MEMORY)
        del d1
        sub.release(ldd.CacheId("p1", 10))
        publish("p3", 3)                                # wraps to the region's start
        r = sub.subscribe(ldd.CacheId("p3", 10), timeout_ms=5000)
        assert r.status == ldd.SUBSCRIBE_STATUS_SUCCESS
        d3 = sub.get_cache_data(ldd.CacheId("p3", 10))
        assert d3.address == buf.address and bytes(d3) == raw(pattern(24 * 1024, 3))
        assert bytes(sub.get_cache_data(ldd.CacheId("p2", 10))) == raw(pattern(24 * 1024, 2))
        assert sorted(c.prompt_hash for c in sub.cached()) == ["p2", "p3"]
        with pytest.raises(ldd.LLMException) as ei:
            sub.get_cache_data(ldd.CacheId("p1", 10))
        assert ei.value.status_code == S.LLM_KV_CACHE_NOT_EXIST
        # A second publisher may not claim the region the first one holds.
        with pytest.raises(PeerError) as ei:
            prompt.ex("pub2 = ldd.KVCachePublisher(); pub2.init(rank_id=4); "
                      "pub2.connect('127.0.0.1', %d, remote_rank_id=5)" % sub.local_port)
        assert ei.value.code == int(S.LLM_PARAM_INVALID) and "overlaps" in str(ei.value)
        prompt.ex("pub2.finalize(); pub.finalize()")
    finally:
        sub.finalize()
    r = sub.subscribe(ldd.CacheId("p2", 10), timeout_ms=10)
    assert r.status == ldd.SUBSCRIBE_STATUS_FAILED


def test_exit_without_finalize():
    code = """
import numpy as np, llm_datadist as ldd
dd = ldd.LLMDataDist(ldd.LLMRole.PROMPT, 7)
cfg = ldd.LLMConfig(); cfg.listen_ip_info = "127.0.0.1:0"
dd.init(cfg.generate_options())
a = np.zeros((2, 64), np.uint8)
dd.cache_manager.register_cache(ldd.CacheDesc(1, [2, 64], ldd.DataType.DT_UINT8), [a])
dd.cache_manager.set_transfer_callback(print)
m = ldd.allocate_host_memory(4096)
print("up", flush=True)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == "up", p.stderr
