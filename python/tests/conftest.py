"""Fixtures shared by the Python tests: etcd, started on free loopback ports
with a temporary data directory (skipped where etcd is not installed)."""
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

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
