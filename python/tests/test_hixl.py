"""pytest tests of the Python module: two processes move bytes through
hixl.Context and hixl.Hixl, send each other notifications (queued and
through a callback, alone and attached to transfers), cancel transfers to a
stopped peer and check generations; bad input raises hixl.HixlError."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import hixl

PEER = os.path.join(os.path.dirname(__file__), "peer.py")
SIZE = 4 << 20


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path, monkeypatch):
    d = tmp_path / "rt"
    monkeypatch.setenv("HIXL_RUNTIME_DIR", str(d))
    return d


class Peer:
    def __init__(self, role, size=SIZE):
        self.p = subprocess.Popen([sys.executable, PEER, role, str(size)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)

    def line(self, timeout=30):
        import select
        r, _, _ = select.select([self.p.stdout], [], [], timeout)
        assert r, "peer did not answer in time"
        return self.p.stdout.readline().strip()

    def say(self, s):
        self.p.stdin.write(s + "\n")
        self.p.stdin.flush()

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
                self.p.wait(timeout=10)
            except Exception:
                self.p.kill()
                self.p.wait()
        self.p.stdout.close()
        return self.p.returncode

    def kill(self):
        self.p.kill()
        self.p.wait()


@pytest.fixture
def peer_factory():
    peers = []

    def make(role, size=SIZE):
        p = Peer(role, size)
        peers.append(p)
        return p
    yield make
    for p in peers:
        if p.p.poll() is None:
            p.kill()


def test_context_two_processes(peer_factory):
    peer = peer_factory("context")
    assert peer.line().startswith("READY")
    with hixl.Context(device_id=1, peer_device_id=0) as ctx:
        assert ctx.peer_engine(timeout=5).startswith("127.0.0.1:")
        buf = ctx.open_buffer("kv", timeout=10)
        assert buf.size == SIZE and not buf.local
        dst = np.zeros(SIZE, dtype=np.uint8)
        ctx.read(buf, dst, SIZE)                       # one-sided read of the peer's buffer
        assert np.array_equal(dst, pattern(SIZE, 1))
        # Write back parts from several kinds of source objects.
        src = pattern(SIZE, 7)
        ctx.write(src[:1000], buf, 1000)                         # numpy
        ctx.write(bytearray(src[1000:2000].tobytes()), buf, 1000, offset=1000)   # bytearray
        ctx.write(memoryview(src[2000:4096].tobytes()), buf, 2096, offset=2000)  # memoryview
        ctx.write(int(src.ctypes.data) + 4096, buf, SIZE - 4096, offset=4096)    # int address
        peer.say("CHECK 0 %d 7" % SIZE)
        assert peer.line() == "OK"
        # Reads into several kinds of destinations.
        ba = bytearray(100)
        ctx.read(buf, ba, 100, offset=50)
        assert bytes(ba) == src[50:150].tobytes()
        mv = memoryview(bytearray(64))
        ctx.read(buf, mv, 64)
        assert mv.tobytes() == src[:64].tobytes()
        # export/import: the same buffer through a string.
        again = ctx.import_buffer(buf.handle)
        out = np.zeros(16, dtype=np.uint8)
        ctx.read(again, out, 16, offset=SIZE - 16)
        assert np.array_equal(out, src[-16:])
    assert peer.close() == 0


def test_context_local_buffer_and_closed():
    with hixl.Context(device_id=3) as ctx:
        buf = ctx.allocate(4096)
        assert buf.local and buf.size == 4096 and ctx.export(buf) == buf.handle
        ctx.write(b"hello world", buf, 11)
        assert buf.view()[:11].tobytes() == b"hello world"
        got = bytearray(5)
        ctx.read(buf, got, 5, offset=6)
        assert got == b"world"
        plain = ctx.allocate(100, flags=hixl.MEM_DEFAULT, name="plain")
        ctx.write(np.arange(100, dtype=np.uint8), plain, 100)
        assert plain.view()[99] == 99
    with pytest.raises(hixl.HixlError):
        ctx.allocate(10)
    with pytest.raises(hixl.HixlError):
        ctx.write(b"x", buf, 1)


def test_context_accepts_buffer_of_another_context(peer_factory):
    # Same process: a Buffer allocated by context a, used by context b directly.
    with hixl.Context(device_id=4) as a, hixl.Context(device_id=5) as b:
        buf = a.allocate(8192, name="shared")
        src = pattern(8192, 11)
        b.write(src, buf, 8192)               # imported into b through buf.handle
        assert bytes(buf.view()) == src.tobytes()
        got = np.zeros(100, dtype=np.uint8)
        b.read(buf, got, 100, offset=10)
        assert np.array_equal(got, src[10:110])
        b.write(b"xy", buf, 2, offset=8190)
        assert bytes(buf.view()[8190:]) == b"xy"
        assert len(b._imported) == 1          # imported once
        # A's imported view of the same memory carries the same handle.
        again = a.import_buffer(buf.handle)
        b.read(again, got, 50)
        assert np.array_equal(got[:50], src[:50]) and len(b._imported) == 1
        # a's view of one of b's own buffers is b's local buffer again.
        mine = b.allocate(64, name="b-own")
        view_in_a = a.import_buffer(mine.handle)
        b.write(b"local!", view_in_a, 6)
        assert bytes(mine.view()[:6]) == b"local!" and len(b._imported) == 1
        # Bounds are those of the buffer.
        with pytest.raises(hixl.HixlError) as ei:
            b.read(buf, got, 100, offset=8150)
        assert ei.value.code_name == "PARAM_INVALID"
        with pytest.raises(hixl.HixlError):
            b.write(src, "not a buffer", 1)
    # Across processes: the peer's buffer, opened by one context, used by another.
    peer = peer_factory("context")
    assert peer.line().startswith("READY")
    with hixl.Context(device_id=1, peer_device_id=0) as opener, hixl.Context(device_id=6) as user:
        remote = opener.open_buffer("kv", timeout=10)
        dst = np.zeros(SIZE, dtype=np.uint8)
        user.read(remote, dst, SIZE)
        assert np.array_equal(dst, pattern(SIZE, 1))
        user.write(pattern(SIZE, 12), remote, SIZE)
        peer.say("CHECK 0 %d 12" % SIZE)
        assert peer.line() == "OK"
    assert peer.close() == 0


def test_hixl_class_two_processes(peer_factory):
    peer = peer_factory("engine")
    engine, addr, size = peer.line().split()
    addr, size = int(addr), int(size)
    h = hixl.Hixl()
    h.initialize("127.0.0.1")
    h.connect(engine, timeout_ms=5000)
    with pytest.raises(hixl.HixlError) as ei:
        h.connect(engine, timeout_ms=5000)
    assert ei.value.code == int(hixl.StatusCode.ALREADY_CONNECTED)
    assert h.get_link_type(engine) in (hixl.LinkType.SHM, hixl.LinkType.TCP)
    dst = np.zeros(size, dtype=np.uint8)
    local, _ = hixl.address_of(dst, True)
    h.transfer_sync(engine, hixl.TransferOp.READ, [(local, addr, size)], timeout_ms=10000)
    assert np.array_equal(dst, pattern(size, 2))
    src = pattern(size, 9)
    reg = h.register_mem(src)          # buffer protocol, no copy
    req = h.transfer_async(engine, hixl.TransferOp.WRITE,
                           [hixl.TransferOpDesc(int(src.ctypes.data), addr, size)], user_data=5)
    deadline = time.time() + 20
    st = h.get_transfer_status(req)
    while st == hixl.TransferStatus.WAITING and time.time() < deadline:
        time.sleep(0.001)
        st = h.get_transfer_status(req)
    assert st == hixl.TransferStatus.COMPLETED
    with pytest.raises(hixl.HixlError):
        h.get_transfer_status(req)     # released once its end was reported
    peer.say("CHECK %d 9" % size)
    assert peer.line() == "OK"
    h.deregister_mem(reg)
    # Out of the peer's region: refused, nothing moves.
    with pytest.raises(hixl.HixlError) as ei:
        h.transfer_sync(engine, hixl.TransferOp.WRITE, [(local, addr + size - 8, 16)])
    assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
    h.disconnect(engine)
    h.finalize()
    assert peer.close() == 0


def test_hixl_class_methods_local():
    h = hixl.Hixl()
    h.initialize("127.0.0.1:0", {"CopyThreads": "2"})
    assert h.local_engine().startswith("127.0.0.1:")
    p = h.alloc_mem(8192)
    handle = h.get_mem_handle(p)
    assert handle != 0
    with pytest.raises(hixl.HixlError):
        h.deregister_mem(handle)       # AllocMem memory: use free_mem
    h.free_mem(p)
    buf = bytearray(4096)
    mh = h.register_mem(buf, perms=hixl.MEM_PERM_READ)
    mh2 = h.register_mem(hixl.MemDesc(hixl.address_of(buf)[0], 4096))
    assert mh == mh2
    h.deregister_mem(mh)
    h.finalize()


def test_bad_input_raises():
    with pytest.raises(hixl.HixlError) as ei:
        hixl.Hixl().initialize("not an address")
    assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
    assert ei.value.code_name == "PARAM_INVALID"
    with pytest.raises(hixl.HixlError):
        hixl.Hixl().initialize("127.0.0.1", {"NoSuchOption": "1"})
    h = hixl.Hixl()
    with pytest.raises(hixl.HixlError):
        h.connect("127.0.0.1:1")          # not initialized
    h.initialize("127.0.0.1")
    with pytest.raises(hixl.HixlError):
        h.get_transfer_status(12345)
    with pytest.raises(hixl.HixlError):
        h.transfer_sync("127.0.0.1:1", hixl.TransferOp.WRITE, [(1, 2, 3)])
    with pytest.raises(hixl.HixlError):
        h.transfer_sync("127.0.0.1:1", hixl.TransferOp.WRITE, [(1, 2)])
    with pytest.raises(hixl.HixlError):
        h.register_mem(0x1000)            # an address needs len
    with pytest.raises(hixl.HixlError):
        h.register_mem(b"read-only bytes", len=100)   # larger than the object
    with pytest.raises(hixl.HixlError):
        h.free_mem(0x1234)
    h.finalize()

    with pytest.raises(hixl.HixlError):
        hixl.Context(device_id=-1)
    with pytest.raises(hixl.HixlError):
        hixl.Context(device_id=0, peer_device_id=0)
    with hixl.Context(device_id=5, peer_device_id=6) as ctx:
        with pytest.raises(hixl.HixlError):
            hixl.Context(device_id=5)     # in use by a live context
    with hixl.Context(device_id=5, peer_device_id=6) as ctx:
        buf = ctx.allocate(1024)
        with pytest.raises(hixl.HixlError):
            ctx.allocate(0)
        with pytest.raises(hixl.HixlError):
            ctx.allocate(10, flags=99)
        with pytest.raises(hixl.HixlError):
            ctx.write(bytearray(2048), buf, 2048)      # larger than buf
        with pytest.raises(hixl.HixlError):
            ctx.write(bytearray(10), buf, 20)          # larger than src
        with pytest.raises(hixl.HixlError):
            ctx.read(buf, b"immutable!", 10)           # read into read-only bytes
        with pytest.raises(hixl.HixlError):
            ctx.write("a str", buf, 1)
        with pytest.raises(hixl.HixlError):
            ctx.write(b"x", "not a buffer", 1)
        with pytest.raises(hixl.HixlError) as ei:
            ctx.import_buffer("garbage")
        assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
        tampered = buf.handle[:-1] + ("0" if buf.handle[-1] != "0" else "1")
        with pytest.raises(hixl.HixlError):
            ctx.import_buffer(tampered)
        with pytest.raises(hixl.HixlError):
            ctx.import_buffer(buf.handle[:20])
        with pytest.raises(hixl.HixlError) as ei:
            ctx.open_buffer("kv", timeout=0.2)          # no peer
        assert ei.value.code == int(hixl.StatusCode.TIMEOUT)


def test_dead_peer_raises(peer_factory):
    peer = peer_factory("context", 1 << 20)
    assert peer.line().startswith("READY")
    with hixl.Context(device_id=1, peer_device_id=0) as ctx:
        buf = ctx.open_buffer("kv", timeout=10)
        handle = buf.handle
        ctx.write(b"abc", buf, 3)
        peer.kill()
        deadline = time.time() + 10
        with pytest.raises(hixl.HixlError):
            while time.time() < deadline:
                ctx.write(b"abc", buf, 3)
                time.sleep(0.01)
        dead = ctx.import_buffer(handle)   # parses; transfers fail
        with pytest.raises(hixl.HixlError):
            ctx.write(b"abc", dead, 3)


def test_torch_tensors(peer_factory):
    torch = pytest.importorskip("torch")
    peer = peer_factory("context", 1 << 20)
    assert peer.line().startswith("READY")
    with hixl.Context(device_id=1, peer_device_id=0) as ctx:
        buf = ctx.open_buffer("kv", timeout=10)
        t = torch.zeros(1 << 20, dtype=torch.uint8)
        ctx.read(buf, t, 1 << 20)
        assert np.array_equal(t.numpy(), pattern(1 << 20, 1))
        with pytest.raises(hixl.HixlError):
            ctx.read(buf, t[::2], 100)      # not contiguous


# ---------------------------------------------------------------- notifications

def wait_notifies(h, count, timeout=10.0):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += h.get_notifies()
        if len(got) < count:
            time.sleep(0.001)
    return got


def test_notify_round_trip_two_processes(peer_factory):
    peer = peer_factory("engine", 1 << 20)
    engine, _, _ = peer.line().split()
    h = hixl.Hixl()
    h.initialize("127.0.0.1:0")
    with pytest.raises(hixl.HixlError) as ei:
        h.send_notify(engine, "early")          # no link yet
    assert ei.value.code == int(hixl.StatusCode.NOT_CONNECTED)
    h.connect(engine, timeout_ms=5000)
    h.send_notify(engine, "hello", b"\x00\x01bytes\xff")     # bytes: exact
    h.send_notify(engine, "ünï", "text msg", timeout_ms=2000)  # str: UTF-8
    h.send_notify(engine, b"raw-name", bytearray(b"ba"))
    h.send_notify(engine, "n" * hixl.MAX_NOTIFY_NAME_LEN, b"m" * hixl.MAX_NOTIFY_MSG_LEN)
    peer.say("NOTIFIES")
    got = json.loads(peer.line())
    assert [g[0] for g in got] == ["hello", "ünï", "raw-name", "n" * 1024]
    assert bytes.fromhex(got[0][1]) == b"\x00\x01bytes\xff"
    assert bytes.fromhex(got[1][1]) == "text msg".encode()
    assert bytes.fromhex(got[2][1]) == b"ba"
    assert bytes.fromhex(got[3][1]) == b"m" * 1024
    assert all(g[2] == h.local_engine() for g in got)
    peer.say("NOTIFIES")
    assert json.loads(peer.line()) == []        # taken
    # The other direction: the peer connects to us and sends.
    peer.say("SEND %s back %s" % (h.local_engine(), "payload"))
    assert peer.line() == "SENT"
    got = wait_notifies(h, 1)
    assert len(got) == 1
    n = got[0]
    assert isinstance(n, hixl.NotifyDesc)
    assert (n.name, n.msg, n.sender) == ("back", b"payload", engine)
    assert h.get_notifies() == []
    # Bad input: nothing is sent.
    for bad in [dict(name="x" * 1025), dict(name="n", msg=b"m" * 1025), dict(name="n", timeout_ms=0)]:
        with pytest.raises(hixl.HixlError) as ei:
            h.send_notify(engine, **bad)
        assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
    with pytest.raises(hixl.HixlError) as ei:
        h.send_notify(engine, "n", 12345)       # not bytes-like
    assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
    with pytest.raises(TypeError):
        h.send_notify(engine)                   # name is required
    peer.say("NOTIFIES")
    assert json.loads(peer.line()) == []
    h.finalize()
    with pytest.raises(hixl.HixlError):
        h.get_notifies()                        # finalized
    assert peer.close() == 0


def test_notify_queue_limit_and_names():
    rx = hixl.Hixl()
    rx.initialize("127.0.0.1:0", {hixl.options.NOTIFY_QUEUE_DEPTH: "3"})
    tx = hixl.Hixl()
    tx.initialize("127.0.0.1:0")
    tx.connect(rx.local_engine())
    for i in range(3):
        tx.send_notify(rx.local_engine(), "n%d" % i)
    with pytest.raises(hixl.HixlError) as ei:
        tx.send_notify(rx.local_engine(), "refused")
    assert ei.value.code == int(hixl.StatusCode.RESOURCE_EXHAUSTED)
    assert ei.value.code_name == "RESOURCE_EXHAUSTED"
    assert [n.name for n in rx.get_notifies()] == ["n0", "n1", "n2"]
    # Room again; a name that is not UTF-8 keeps its bytes (surrogate escapes).
    tx.send_notify(rx.local_engine(), b"\xff\xfename", b"")
    (n,) = rx.get_notifies()
    assert n.name.encode("utf-8", "surrogateescape") == b"\xff\xfename"
    assert n.msg == b"" and n.sender == tx.local_engine()
    tx.finalize()
    rx.finalize()


def test_transfer_with_notify(peer_factory):
    size = 4 << 20
    peer = peer_factory("engine", size)
    engine, addr, _ = peer.line().split()
    addr = int(addr)
    h = hixl.Hixl()
    h.initialize("127.0.0.1")
    h.connect(engine, timeout_ms=5000)
    # Async: the peer polls its queue and checks the memory the moment the
    # notification shows up.
    src = pattern(size, 11)
    peer.say("WAITNOTIFY kv %d 11 20" % size)
    req = h.transfer_async(engine, hixl.TransferOp.WRITE, [(int(src.ctypes.data), addr, size)],
                           notify=("kv", b"layer0"), timeout_ms=20000)
    assert peer.line() == "OK " + b"layer0".hex()
    deadline = time.time() + 20
    st = h.get_transfer_status(req)
    while st == hixl.TransferStatus.WAITING and time.time() < deadline:
        time.sleep(0.001)
        st = h.get_transfer_status(req)
    assert st == hixl.TransferStatus.COMPLETED
    # Blocking, with a callback on the peer side checking the memory.
    peer.say("CBCHECK %d 12" % size)
    assert peer.line() == "SET"
    src = pattern(size, 12)
    h.transfer_sync(engine, hixl.TransferOp.WRITE, [(int(src.ctypes.data), addr, size)],
                    timeout_ms=20000, notify=("cb", "x"))
    peer.say("CBGET 1 10")
    assert json.loads(peer.line()) == [["cb", b"x".hex(), h.local_engine(), True]]
    # A NotifyDesc works as notify= too; a READ may carry one.
    dst = np.zeros(4096, dtype=np.uint8)
    h.transfer_sync(engine, hixl.TransferOp.READ, [(hixl.address_of(dst, True)[0], addr, 4096)],
                    notify=hixl.NotifyDesc("read", b"r", "ignored"))
    assert np.array_equal(dst, src[:4096])
    peer.say("CBGET 1 10")
    assert json.loads(peer.line()) == [["read", b"r".hex(), h.local_engine(), True]]
    # Bad notify arguments: refused before anything moves.
    for bad in [("x" * 1025, b""), ("n", b"m" * 1025), 42, ("a", "b", "c", "d"), ()]:
        with pytest.raises(hixl.HixlError) as ei:
            h.transfer_sync(engine, hixl.TransferOp.WRITE, [(int(src.ctypes.data), addr, 16)], notify=bad)
        assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID), bad
    peer.say("CBGET 0 0")
    assert json.loads(peer.line()) == []
    h.finalize()
    assert peer.close() == 0


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the "raise" one
def test_notify_callback_delivery(peer_factory):
    peer = peer_factory("engine", 1 << 20)
    engine, _, _ = peer.line().split()
    h = hixl.Hixl()
    h.initialize("127.0.0.1:0")
    got = []
    arrived = threading.Condition()
    threads = set()

    def cb(n):
        threads.add(threading.get_ident())
        with arrived:
            got.append(n)
            arrived.notify_all()
        if n.name == "raise":
            raise RuntimeError("a failing callback does not stop delivery")

    with pytest.raises(hixl.HixlError):
        h.set_notify_callback(42)               # not callable
    h.set_notify_callback(cb)
    for i, name in enumerate(["one", "raise", "two"]):
        peer.say("SEND %s %s m%d" % (h.local_engine(), name, i))
        assert peer.line() == "SENT"
    with arrived:
        assert arrived.wait_for(lambda: len(got) >= 3, 10)
    assert [(n.name, n.msg, n.sender) for n in got] == [
        ("one", b"m0", engine), ("raise", b"m1", engine), ("two", b"m2", engine)]
    assert threading.get_ident() not in threads  # an engine thread called it
    assert h.get_notifies() == []               # went to the callback, not the queue
    # None: back to the queue.
    h.set_notify_callback(None)
    peer.say("SEND %s queued q" % h.local_engine())
    assert peer.line() == "SENT"
    assert [n.name for n in wait_notifies(h, 1)] == ["queued"]
    assert len(got) == 3
    # A callback that calls back into the engine, and one that tries to
    # finalize it (refused: it would deadlock).
    answers = []

    def reentrant(n):
        answers.append(h.get_notifies())
        try:
            h.finalize()
        except hixl.HixlError as e:
            answers.append(e.code_name)

    h.set_notify_callback(reentrant)
    peer.say("SEND %s re x" % h.local_engine())
    assert peer.line() == "SENT"
    deadline = time.time() + 10
    while len(answers) < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert answers == [[], "FAILED"]
    # Finalize while the callback is busy: it waits for the callback, no deadlock.
    busy = threading.Event()

    def slow(n):
        busy.set()
        time.sleep(0.3)

    h.set_notify_callback(slow)
    peer.say("SEND %s slow x" % h.local_engine())
    assert peer.line() == "SENT"
    assert busy.wait(10)
    t0 = time.time()
    h.finalize()
    assert time.time() - t0 < 5
    assert peer.close() == 0


def test_finalize_at_exit_with_a_busy_callback(tmp_path):
    # An engine left alive with a callback in flight when the interpreter exits.
    script = tmp_path / "exit.py"
    script.write_text(
        "import threading, time, hixl\n"
        "rx = hixl.Hixl(); rx.initialize('127.0.0.1:0')\n"
        "tx = hixl.Hixl(); tx.initialize('127.0.0.1'); tx.connect(rx.local_engine())\n"
        "busy = threading.Event()\n"
        "def cb(n):\n"
        "    busy.set(); time.sleep(0.3)\n"
        "rx.set_notify_callback(cb)\n"
        "tx.send_notify(rx.local_engine(), 'x')\n"
        "assert busy.wait(10)\n"
        "print('exiting', flush=True)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "exiting"


# ---------------------------------------------------------------- cancel, deadlines

def test_cancel_transfer_to_a_stopped_peer(peer_factory):
    size = 64 << 20                             # more than the sockets buffer
    peer = peer_factory("engine", size)
    engine, addr, _ = peer.line().split()
    addr = int(addr)
    h = hixl.Hixl()
    h.initialize("127.0.0.1", {hixl.options.LINK_TYPE: "TCP"})
    h.connect(engine, timeout_ms=5000)
    src = pattern(size, 21)
    desc = [(int(src.ctypes.data), addr, size)]
    with pytest.raises(hixl.HixlError) as ei:
        h.cancel_transfer(123456)               # unknown request
    assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
    # A request that ended first: cancelling it changes nothing.
    req = h.transfer_async(engine, hixl.TransferOp.WRITE, [(int(src.ctypes.data), addr, 4096)])
    time.sleep(0.5)
    h.cancel_transfer(req)
    assert h.get_transfer_status(req) == hixl.TransferStatus.COMPLETED

    def stopped_for(seconds):
        os.kill(peer.p.pid, signal.SIGSTOP)
        t = threading.Timer(seconds, os.kill, (peer.p.pid, signal.SIGCONT))
        t.start()
        return t

    # Cancelled while the peer cannot answer: CANCELLED once it has stopped.
    cont = stopped_for(0.5)
    try:
        req = h.transfer_async(engine, hixl.TransferOp.WRITE, desc)
        time.sleep(0.05)
        assert h.get_transfer_status(req) == hixl.TransferStatus.WAITING
        h.cancel_transfer(req)
        st, code, msg = h.get_transfer_status(req, with_reason=True)
        assert st == hixl.TransferStatus.CANCELLED, msg
        assert code == int(hixl.StatusCode.CANCELLED) and "cancel" in msg
        with pytest.raises(hixl.HixlError):
            h.get_transfer_status(req)          # released once its end was reported
    finally:
        cont.join()
    # An async deadline: TIMEOUT.
    cont = stopped_for(0.5)
    try:
        req = h.transfer_async(engine, hixl.TransferOp.WRITE, desc, timeout_ms=100)
        deadline = time.time() + 20
        st = h.get_transfer_status(req, with_reason=True)
        while st[0] == hixl.TransferStatus.WAITING and time.time() < deadline:
            time.sleep(0.005)
            st = h.get_transfer_status(req, with_reason=True)
        assert st[0] == hixl.TransferStatus.TIMEOUT, st
        assert st[1] == int(hixl.StatusCode.TIMEOUT)
    finally:
        cont.join()
    # The link still works.
    h.transfer_sync(engine, hixl.TransferOp.WRITE, desc, timeout_ms=30000)
    peer.say("CHECK %d 21" % size)
    assert peer.line() == "OK"
    assert hixl.StatusCode(9).name == "CANCELLED"
    h.finalize()
    assert peer.close() == 0


# ---------------------------------------------------------------- connects, generations

def test_connect_async_and_generations(peer_factory):
    peer = peer_factory("engine", 1 << 20)
    engine, addr, size = peer.line().split()
    addr, size = int(addr), int(size)
    peer.say("GEN")
    peer_gen = int(peer.line())
    h = hixl.Hixl()
    assert h.generation() == 0                  # not initialized
    h.initialize("127.0.0.1", {hixl.options.HEARTBEAT_INTERVAL_MS: "200",
                               hixl.options.HEARTBEAT_MISSES: "5",
                               hixl.options.CONNECT_TIMEOUT_MS: "3000",
                               hixl.options.MAX_PEERS: "4",
                               hixl.options.AUTO_CONNECT: "0"})
    assert h.generation() != 0
    assert h.get_connect_status(engine) == hixl.ConnectStatus.NOT_CONNECTED
    h.connect_async(engine, timeout_ms=5000)
    deadline = time.time() + 10
    while h.get_connect_status(engine) != hixl.ConnectStatus.CONNECTED and time.time() < deadline:
        time.sleep(0.005)
    assert h.get_connect_status(engine, with_reason=True)[0] == hixl.ConnectStatus.CONNECTED
    with pytest.raises(hixl.HixlError) as ei:
        h.connect_async(engine)
    assert ei.value.code == int(hixl.StatusCode.ALREADY_CONNECTED)
    assert h.get_peer_generation(engine) == peer_gen
    dst = np.zeros(size, dtype=np.uint8)
    local = hixl.address_of(dst, True)[0]
    h.transfer_sync(engine, hixl.TransferOp.READ, [(local, addr, size)], remote_generation=peer_gen)
    assert np.array_equal(dst, pattern(size, 2))
    with pytest.raises(hixl.HixlError) as ei:
        h.transfer_sync(engine, hixl.TransferOp.READ, [(local, addr, size)], remote_generation=peer_gen + 1)
    assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID) and "restarted" in str(ei.value)
    with pytest.raises(hixl.HixlError) as ei:
        h.transfer_async(engine, hixl.TransferOp.READ, [(local, addr, size)], remote_generation=peer_gen + 1)
    assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
    # A failed async connect says why.
    dead = hixl.Hixl()
    dead.initialize("127.0.0.1:0")
    dead_addr = dead.local_engine()
    dead.finalize()
    h.connect_async(dead_addr, timeout_ms=1000)
    deadline = time.time() + 10
    st = h.get_connect_status(dead_addr, with_reason=True)
    while st[0] == hixl.ConnectStatus.CONNECTING and time.time() < deadline:
        time.sleep(0.005)
        st = h.get_connect_status(dead_addr, with_reason=True)
    assert st[0] == hixl.ConnectStatus.FAILED and st[1] != 0, st
    with pytest.raises(hixl.HixlError) as ei:
        h.get_peer_generation(dead_addr)
    assert ei.value.code == int(hixl.StatusCode.NOT_CONNECTED)
    # The peer dies: the heartbeat notices, the link is gone.
    peer.kill()
    deadline = time.time() + 10
    while h.get_connect_status(engine) == hixl.ConnectStatus.CONNECTED and time.time() < deadline:
        time.sleep(0.01)
    assert h.get_connect_status(engine) == hixl.ConnectStatus.NOT_CONNECTED
    h.finalize()


def test_option_keys():
    keys = {k: getattr(hixl.options, k) for k in dir(hixl.options) if k.isupper()}
    assert keys["NOTIFY_QUEUE_DEPTH"] == "NotifyQueueDepth"
    assert {"HEARTBEAT_INTERVAL_MS", "HEARTBEAT_MISSES", "AUTO_CONNECT", "CONNECT_TIMEOUT_MS",
            "MAX_PEERS", "PEERS_LOW_WATER", "NOTIFY_QUEUE_DEPTH", "LINK_TYPE", "TCP_LANES"} <= set(keys)
    with pytest.raises(hixl.HixlError) as ei:
        hixl.Hixl().initialize("127.0.0.1", {hixl.options.NOTIFY_QUEUE_DEPTH: "0"})
    assert ei.value.code == int(hixl.StatusCode.PARAM_INVALID)
    h = hixl.Hixl()
    h.initialize("127.0.0.1", {hixl.options.MAX_PEERS: "8", hixl.options.PEERS_LOW_WATER: "2"})
    h.finalize()


def test_authenticated_links(tmp_path):
    secret = "python side shared secret"
    path = tmp_path / "secret"
    path.write_text(secret + "\n")
    path.chmod(0o600)
    rx = hixl.Hixl()
    rx.initialize("127.0.0.1:0", {hixl.options.AUTH_SECRET_FILE: str(path)})
    good = hixl.Hixl()
    good.initialize("127.0.0.1:0", {hixl.options.AUTH_SECRET: secret})
    good.connect(rx.local_engine())
    good.send_notify(rx.local_engine(), "authenticated")
    assert [n.name for n in rx.get_notifies()] == ["authenticated"]
    for opts, says in (({hixl.options.AUTH_SECRET: "some other shared secret"}, "authentication failed"),
                       ({}, "requires authentication")):
        bad = hixl.Hixl()
        bad.initialize("127.0.0.1:0", opts)
        with pytest.raises(hixl.HixlError) as ei:
            bad.connect(rx.local_engine())
        assert says in str(ei.value)
        bad.finalize()
    path.chmod(0o644)
    with pytest.raises(hixl.HixlError) as ei:
        hixl.Hixl().initialize("127.0.0.1:0", {hixl.options.AUTH_SECRET_FILE: str(path)})
    assert ei.value.code_name == "PARAM_INVALID" and "chmod 600" in str(ei.value)
    good.finalize()
    rx.finalize()


def _maps_contain(needle):
    with open("/proc/self/maps") as f:
        return any(needle in line for line in f)


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_register_mem_share_by_mapping(kind):
    # A framework's CPU tensor, registered with REGISTER_SHARE_BY_MAPPING: its
    # pages move in place into shared memory (same address, same contents),
    # a local peer writes into it by mapping, and deregister_mem moves them back.
    n = 8 << 20
    if kind == "torch":
        torch = pytest.importorskip("torch")
        t = torch.arange(n, dtype=torch.uint8)
        addr, view = t.data_ptr(), lambda: t.numpy()
    else:
        a = np.arange(n, dtype=np.uint64).astype(np.uint8)
        addr, view = int(a.ctypes.data), lambda: a
    before = view().copy()
    target, initiator = hixl.Hixl(), hixl.Hixl()
    target.initialize("127.0.0.1:0")
    initiator.initialize("127.0.0.1", {"LinkType": "SHM"})
    try:
        reg = target.register_mem(hixl.MemDesc(addr, n), flags=hixl.REGISTER_SHARE_BY_MAPPING)
        assert np.array_equal(view(), before)
        assert _maps_contain("memfd:hixl-user")
        initiator.connect(target.local_engine(), timeout_ms=5000)
        src = pattern(n, 21)
        initiator.register_mem(src)
        initiator.transfer_sync(target.local_engine(), hixl.TransferOp.WRITE,
                                [(int(src.ctypes.data), addr, n)], timeout_ms=10000)
        assert np.array_equal(view(), src)
        target.deregister_mem(reg)
        assert np.array_equal(view(), src)
        with pytest.raises(hixl.HixlError):
            target.register_mem(hixl.MemDesc(addr, n), flags=1 << 9)
    finally:
        initiator.finalize()
        target.finalize()
    assert not _maps_contain("memfd:hixl-user")


def test_descriptor_array(peer_factory):
    """An N x 3 uint64 array stands for N (local, remote, len) descriptors;
    any other array is refused before a byte moves."""
    size = 1 << 20
    peer = peer_factory("engine", size)
    engine, addr, _ = peer.line().split()
    addr = int(addr)
    h = hixl.Hixl()
    h.initialize("127.0.0.1")
    h.connect(engine, timeout_ms=5000)
    src = pattern(size, 21)
    base = int(src.ctypes.data)
    # Every other 4 KiB page, in reverse order.
    rows = [(base + i * 4096, addr + (255 - i) * 4096, 4096) for i in range(0, 256, 2)]
    h.transfer_sync(engine, hixl.TransferOp.WRITE, np.array(rows, dtype=np.uint64))
    back = np.zeros(size, dtype=np.uint8)
    h.transfer_sync(engine, hixl.TransferOp.READ,
                    np.array([(int(back.ctypes.data), addr, size)], dtype=np.uint64))
    for i in range(256):
        got = back[(255 - i) * 4096:(256 - i) * 4096]
        if i % 2 == 0:
            assert np.array_equal(got, src[i * 4096:(i + 1) * 4096]), i
    for bad in (np.zeros((2, 2), dtype=np.uint64), np.zeros((2, 3), dtype=np.int32),
                np.zeros((3, 3), dtype=np.uint64)[:, ::1][::2], np.zeros(3, dtype=np.uint64)):
        with pytest.raises(hixl.HixlError, match="PARAM_INVALID"):
            h.transfer_sync(engine, hixl.TransferOp.WRITE, bad)
    h.finalize()
