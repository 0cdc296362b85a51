"""pytest tests of the Python module: two processes move bytes through
hixl.Context and hixl.Hixl; bad input raises hixl.HixlError."""
import os
import subprocess
import sys
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
