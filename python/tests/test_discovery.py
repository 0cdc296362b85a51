"""etcd discovery from Python: engines published by name, found, listed and
used by name (hixl.options.METADATA_SERVER ...). Starts its own etcd on free
loopback ports with a temporary data directory; skipped where etcd is not
installed or the build has no etcd discovery."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest

import hixl

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def etcd():
    if not os.access(ETCD, os.X_OK):
        pytest.skip("etcd is not installed (Debian: etcd-server)")
    data = tempfile.mkdtemp(prefix="hixl-py-etcd-")
    client, peer = free_port(), free_port()
    url = "http://127.0.0.1:%d" % client
    proc = subprocess.Popen(
        [ETCD, "--name=py", "--data-dir=" + data, "--listen-client-urls=" + url,
         "--advertise-client-urls=" + url,
         "--listen-peer-urls=http://127.0.0.1:%d" % peer,
         "--initial-advertise-peer-urls=http://127.0.0.1:%d" % peer,
         "--initial-cluster=py=http://127.0.0.1:%d" % peer,
         "--unsafe-no-fsync", "--heartbeat-interval=10", "--election-timeout=50"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 15
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if b'"true"' in r.read():
                        break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                pytest.fail("etcd did not become healthy")
            time.sleep(0.05)
        yield "etcd://127.0.0.1:%d" % client
    finally:
        proc.kill()
        proc.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)


def test_list_engines_needs_a_metadata_server():
    h = hixl.Hixl()
    h.initialize("127.0.0.1")
    with pytest.raises(hixl.HixlError) as ei:
        h.list_engines()
    assert ei.value.code_name == "UNSUPPORTED"
    h.finalize()
    assert hixl.options.METADATA_SERVER == "MetadataServer"
    assert hixl.options.ENGINE_NAME == "EngineName"


def test_engines_find_each_other_by_name(etcd):
    a = hixl.Hixl()
    try:
        a.initialize("127.0.0.1:0", {hixl.options.METADATA_SERVER: etcd,
                                     hixl.options.ENGINE_NAME: "prefill-0"})
    except hixl.HixlError as e:
        if e.code_name == "UNSUPPORTED":
            pytest.skip("this build has no etcd discovery")
        raise
    b = hixl.Hixl()
    b.initialize("127.0.0.1", {hixl.options.METADATA_SERVER: etcd})
    names = {n: (addr, gen) for n, addr, gen in b.list_engines()}
    assert names["prefill-0"] == (a.local_engine(), a.generation())

    dst = np.zeros(1 << 16, dtype=np.uint8)
    a.register_mem(dst)
    src = np.arange(1 << 16, dtype=np.uint32).astype(np.uint8)
    b.register_mem(src)
    b.connect("prefill-0", timeout_ms=5000)
    assert b.get_peer_generation("prefill-0") == a.generation()
    b.transfer_sync("prefill-0", hixl.TransferOp.WRITE,
                    [(int(src.ctypes.data), int(dst.ctypes.data), src.nbytes)], timeout_ms=5000)
    assert np.array_equal(dst, src)
    with pytest.raises(hixl.HixlError):
        b.connect("no-such-engine", timeout_ms=1000)

    a.finalize()      # revokes its lease: gone at once
    deadline = time.time() + 5
    while any(n == "prefill-0" for n, _, _ in b.list_engines()) and time.time() < deadline:
        time.sleep(0.01)
    assert all(n != "prefill-0" for n, _, _ in b.list_engines())
    b.finalize()
