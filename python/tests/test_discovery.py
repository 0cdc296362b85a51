"""etcd discovery from Python: engines published by name, found, listed and
used by name (hixl.options.METADATA_SERVER ...). Starts its own etcd on free
loopback ports with a temporary data directory; skipped where etcd is not
installed or the build has no etcd discovery. The etcd fixture is in
conftest.py."""
import time

import numpy as np
import pytest

import hixl


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
