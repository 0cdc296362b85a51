"""The hixl transfer backend against SGLang from PyPI (scripts/sglang-env.sh):
prefill and decode ranks in real processes (node.py), SGLang's own sender,
receiver and bootstrap-server code around our manager, real bytes over shm
and tcp checked page by page.

Run: PYTHONPATH=build/python build/sglang-venv/bin/python -m pytest python/tests/sglang
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("sglang", reason="SGLang's environment: scripts/sglang-env.sh")

HERE = os.path.dirname(os.path.abspath(__file__))
NODE = os.path.join(HERE, "node.py")
sys.path.insert(0, os.path.dirname(HERE))
from conftest import etcd  # noqa: E402,F401 -- the fixture (a real etcd on loopback)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """A node.py process: one prefill or decode rank."""

    def __init__(self, role, port, *, rank=0, tp=1, serve=False, transport="tcp", extra=(),
                 env=None):
        e = dict(os.environ)
        e.update({"SGLANG_HOST_IP": "127.0.0.1", "SGLANG_HIXL_TRANSPORT": transport,
                  "PYTHONWARNINGS": "ignore"})
        e.update(env or {})
        args = [sys.executable, NODE, "--role", role, "--bootstrap-port", str(port),
                "--rank", str(rank), "--tp", str(tp)] + list(extra)
        if serve:
            args.append("--serve")
        self.role, self.rank = role, rank
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(os.path.join(LOGS, "%s-%d-%d.log"
                                                           % (role, rank, port)), "w"),
                                  env=e, text=True, bufsize=1)
        self.engine = None

    def ready(self):
        """Waits for the rank's manager (SGLang's import takes a while)."""
        line = self._line(180)
        assert line.startswith("READY"), line
        self.engine = line.split()[1]
        return self

    def _line(self, timeout):
        import select
        deadline = time.time() + timeout
        while time.time() < deadline:
            r, _, _ = select.select([self.p.stdout], [], [], 0.5)
            if r:
                line = self.p.stdout.readline()
                if not line:
                    break
                return line.strip()
            if self.p.poll() is not None:
                break
        raise AssertionError("%s rank %d said nothing (exit %s)"
                             % (self.role, self.rank, self.p.poll()))

    def __call__(self, *words, timeout=60):
        self.p.stdin.write(" ".join(str(w) for w in words) + "\n")
        self.p.stdin.flush()
        out = json.loads(self._line(timeout))
        assert "error" not in out, out
        return out

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.write("quit\n")
                self.p.stdin.flush()
                self.p.wait(10)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        self.kill()


LOGS = os.environ.get("HIXL_SGLANG_TEST_LOGS", "/tmp/hixl-sglang-test-logs")
os.makedirs(LOGS, exist_ok=True)


def start(made, ptp=1, dtp=1, *, transport="tcp", extra=(), env=None):
    """Prefill ranks (TP ptp, the bootstrap server in rank 0) and decode ranks
    (TP dtp), all started at once."""
    port = free_port()
    pre = [Node("prefill", port, rank=r, tp=ptp, serve=r == 0, transport=transport,
                extra=extra, env=env) for r in range(ptp)]
    made.extend(pre)
    dec = [Node("decode", port, rank=r, tp=dtp, transport=transport, extra=extra, env=env)
           for r in range(dtp)]
    made.extend(dec)
    for n in pre + dec:
        n.ready()
    return pre, dec


@pytest.fixture
def cluster():
    """cluster(prefill_tp, decode_tp, **kw) -> (prefill ranks, decode ranks),
    stopped after the test."""
    made = []
    yield lambda *a, **kw: start(made, *a, **kw)
    for n in made:
        n.close()


@pytest.fixture(scope="module")
def pair():
    """One prefill and one decode rank over tcp, shared by the tests that leave
    both alive (each uses its own rooms)."""
    made = []
    pre, dec = start(made, env={"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "20"})
    yield pre[0], dec[0]
    for n in made:
        n.close()


def pages(xs):
    return ",".join(str(x) for x in xs) or "-"


def transfer(pre, dec, room, src, dst, *, chunks=None, src_aux=3, dst_aux=5, check=True):
    """One request the way SGLang's schedulers drive it: the decode ranks ask,
    each prefill rank sends its chunks; both sides end Success and every
    decode rank holds its heads of the prompt's pages."""
    for d in dec:
        d("receiver", room)
    for d in dec:
        d("meta", room, pages(dst), dst_aux)
    for p in pre:
        p("sender", room)
        assert p("wait", room, "WaitingForInput", 30)["state"] == "WaitingForInput"
        p("init", room, len(src), src_aux)
        for c in chunks or [src]:
            p("send", room, pages(c))
    for p in pre:
        assert p("wait", room, "Success", 60)["state"] == "Success"
    for d in dec:
        assert d("wait", room, "Success", 60)["state"] == "Success"
        if check:
            assert d("check", pages(src), pages(dst), src_aux, dst_aux)["ok"] is True
    return [p("states", room)["states"] for p in pre], [d("states", room)["states"] for d in dec]


def test_sglang_loads_hixl_classes_by_name():
    """SGLang's own plugin loader, enum, CLI and class lookup see the backend;
    the other backends are untouched."""
    import argparse
    import importlib.metadata

    from sglang.srt.plugins import load_plugins
    load_plugins()
    import sglang.srt.disaggregation.decode as decode_module
    import sglang.srt.disaggregation.prefill as prefill_module
    from sglang.srt.disaggregation.common.conn import (CommonKVManager, CommonKVReceiver,
                                                       CommonKVSender)
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class
    from sglang.srt.server_args import ServerArgs

    import hixl.sglang
    from hixl.sglang import _conn

    eps = [e for e in importlib.metadata.entry_points(group="sglang.srt.plugins")
           if e.name == "hixl"]
    assert [e.value for e in eps] == ["hixl.sglang:register"]
    tb = TransferBackend("hixl")
    assert tb is TransferBackend.HIXL and tb in list(TransferBackend)
    got = {k.value: get_kv_class(tb, k) for k in KVClassType}
    assert got == hixl.sglang.classes()
    assert issubclass(got["manager"], CommonKVManager)
    assert issubclass(got["sender"], CommonKVSender)
    assert issubclass(got["receiver"], CommonKVReceiver)
    # The modules SGLang's schedulers call it from see the same function.
    assert decode_module.get_kv_class(tb, KVClassType.RECEIVER) is _conn.HixlKVReceiver
    assert prefill_module.get_kv_class(tb, KVClassType.SENDER) is _conn.HixlKVSender
    assert get_kv_class(TransferBackend.FAKE, KVClassType.SENDER).__name__ == "FakeKVSender"
    hixl.sglang.register()        # a second call changes nothing
    assert list(TransferBackend).count(tb) == 1
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    a = parser.parse_args(["--model-path", "m", "--disaggregation-transfer-backend", "hixl"])
    assert a.disaggregation_transfer_backend == "hixl"


def test_state_sequence_matches_the_fake_backend(pair):
    """The same calls on SGLang's fake backend and on hixl: the states the
    schedulers act on come in the same order; hixl only adds the documented
    transitional ones (Bootstrapping before the decode's metadata arrived,
    Transferring while writes are in flight)."""
    from sglang.srt.disaggregation.fake.conn import FakeKVReceiver, FakeKVSender
    names = {0: "Failed", 1: "Bootstrapping", 2: "WaitingForInput", 3: "Transferring",
             4: "Success"}
    fs, fr = FakeKVSender(None, "x:1", 1), FakeKVReceiver(None, "x:1", 1)
    fake_s, fake_r = [], []

    def note(seq, st):
        if not seq or seq[-1] != names[int(st)]:
            seq.append(names[int(st)])

    note(fake_r, fr.poll())
    fr.init(0)
    note(fake_r, fr.poll())
    fr.send_metadata([1, 2], 5)
    note(fake_s, fs.poll())
    fs.init(2, 3)
    note(fake_s, fs.poll())
    fs.send([1, 2])
    note(fake_s, fs.poll())
    note(fake_r, fr.poll())

    p, d = pair
    d("zero")
    ps, ds = transfer([p], [d], 201, [1, 2], [1, 2])
    assert [x for x in ps[0] if x not in ("Bootstrapping", "Transferring")] == fake_s
    assert [x for x in ds[0] if x != "Transferring"] == fake_r
    assert fake_s == ["WaitingForInput", "Success"]
    assert fake_r == ["Bootstrapping", "WaitingForInput", "Success"]


def test_pages_land_chunk_by_chunk(pair):
    p, d = pair
    d("zero")
    src = [3, 4, 5, 6, 9, 10, 20, 21, 22, 40]
    dst = [11, 12, 13, 30, 31, 32, 33, 0, 1, 63]
    ps, ds = transfer([p], [d], 7, src, dst, chunks=[src[:4], src[4:7], src[7:]])
    assert "Transferring" in ps[0]


def test_metadata_alone_when_the_decode_holds_every_page(pair):
    """A request with no page to send (the decode's prefix cache had them all):
    the last chunk is empty and carries the metadata row only."""
    p, d = pair
    d("zero")
    transfer([p], [d], 8, [], [], src_aux=6, dst_aux=2)


def test_decode_abort_stops_the_prefill(pair):
    p, d = pair
    d("zero")
    d("receiver", 9)
    d("meta", 9, pages([5, 6, 7]), 1)
    p("sender", 9)
    assert p("wait", 9, "WaitingForInput", 30)["state"] == "WaitingForInput"
    p("init", 9, 3, 1)
    d("abort", 9)
    assert d("wait", 9, "Failed", 5)["state"] == "Failed"
    # SGLang's deferred KV release (on by default): the decode frees the pages
    # once the prefill said nothing more of the request can land.
    assert d("drained", 9, 1, 10)["drained"] is True
    t0 = time.time()
    assert p("wait", 9, "Failed", 20)["state"] == "Failed"
    assert time.time() - t0 < 10
    p("send", 9, pages([1, 2, 3]))      # the scheduler may still call it
    time.sleep(0.5)
    assert d("untouched")["untouched"] is True
    assert "abort" in p("failure", 9)["message"].lower()


def test_prefill_abort_fails_the_decode_at_once(pair):
    p, d = pair
    d("zero")
    d("receiver", 10)
    d("meta", 10, pages([5, 6]), 1)
    p("sender", 10)
    assert p("wait", 10, "WaitingForInput", 30)["state"] == "WaitingForInput"
    p("init", 10, 2, 1)
    t0 = time.time()
    p("abort", 10)
    # Well inside the decode's 20 s waiting timeout (the pair's setting).
    assert d("wait", 10, "Failed", 10)["state"] == "Failed"
    assert time.time() - t0 < 10
    assert "Abort" in d("failure", 10)["message"]
    assert d("untouched")["untouched"] is True


def test_pages_outside_the_decode_buffers_are_refused(pair):
    """A page index past the decode's buffers fails the request on both sides
    with the reason, and no byte is written anywhere."""
    p, d = pair
    d("zero")
    d("receiver", 11)
    d("meta", 11, pages([1, 64]), 1)          # the decode has pages 0..63
    p("sender", 11)
    assert p("wait", 11, "WaitingForInput", 30)["state"] == "WaitingForInput"
    p("init", 11, 2, 1)
    p("send", 11, pages([1, 2]))
    assert p("wait", 11, "Failed", 20)["state"] == "Failed"
    assert d("wait", 11, "Failed", 20)["state"] == "Failed"
    assert "outside" in d("failure", 11)["message"]
    assert d("untouched")["untouched"] is True


def test_engines_by_name_through_etcd(cluster, etcd):
    """With a metadata server, each rank's engine is published in etcd under a
    name and the prefill reaches the decode by that name."""
    import hixl
    pre, dec = cluster(env={"SGLANG_HIXL_METADATA_SERVER": etcd})
    assert dec[0].engine.startswith("sglang-decode-127.0.0.1-")
    assert pre[0].engine.startswith("sglang-prefill-127.0.0.1-")
    transfer(pre, dec, 18, [5, 6, 7], [1, 2, 3])
    h = hixl.Hixl()
    h.initialize("127.0.0.1", {hixl.options.METADATA_SERVER: etcd})
    try:
        names = {e[0] for e in h.list_engines()}
    finally:
        h.finalize()
    assert {pre[0].engine, dec[0].engine} <= names


def test_shared_memory(cluster):
    pre, dec = cluster(transport="shm")
    src = list(range(10, 30))
    transfer(pre, dec, 12, src, list(range(40, 60)), chunks=[src[:7], src[7:]])


@pytest.mark.parametrize("ptp,dtp", [(1, 2), (2, 1), (1, 4), (4, 1)])
def test_different_tp_slices_heads(cluster, ptp, dtp):
    """Every decode rank receives its own heads of every page, from the
    prefill rank(s) holding them."""
    pre, dec = cluster(ptp, dtp)
    src = [2, 3, 4, 8, 9]
    transfer(pre, dec, 13, src, [20, 21, 22, 23, 50], chunks=[src[:2], src[2:]])


def test_mla_is_replicated_to_every_decode_rank(cluster):
    pre, dec = cluster(1, 2, extra=["--mla"])
    transfer(pre, dec, 14, [1, 2, 3], [7, 8, 9])


def test_killed_decode_fails_the_prefill(cluster):
    pre, dec = cluster(env={"SGLANG_HIXL_TRANSFER_TIMEOUT_MS": "3000"})
    p, d = pre[0], dec[0]
    transfer(pre, dec, 15, [1], [1])             # linked
    d("receiver", 16)
    d("meta", 16, pages([2, 3]), 1)
    p("sender", 16)
    assert p("wait", 16, "WaitingForInput", 30)["state"] == "WaitingForInput"
    p("init", 16, 2, 1)
    d.kill()
    t0 = time.time()
    p("send", 16, pages([4, 5]))
    assert p("wait", 16, "Failed", 30)["state"] == "Failed"
    assert time.time() - t0 < 30
    assert p("failure", 16)["message"]


def test_killed_prefill_fails_the_decode(cluster):
    env = {"SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2",
           "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "1"}
    pre, dec = cluster(env=env)
    p, d = pre[0], dec[0]
    d("receiver", 17)
    d("meta", 17, pages([2, 3]), 1)
    p("sender", 17)
    assert p("wait", 17, "WaitingForInput", 30)["state"] == "WaitingForInput"
    p.kill()
    t0 = time.time()
    assert d("wait", 17, "Failed", 30)["state"] == "Failed"
    assert time.time() - t0 < 30
    assert "prefill" in d("failure", 17)["message"].lower()
