"""pytest tests of CUDA device memory through the Python module, against the
fake driver of tests/fake_cuda (CTest sets HIXL_CUDA_DRIVER to it): objects
with a __cuda_array_interface__ (as CuPy and Numba arrays have; CUDA torch
tensors go through data_ptr) register as MEM_DEVICE without a copy, and
their bytes move between two engines over a tcp link. The fake's device
memory faults on any CPU access, so a path that touched it directly would
crash this test."""
import os

import numpy as np
import pytest

import hixl

pytestmark = pytest.mark.skipif("HIXL_CUDA_DRIVER" not in os.environ,
                                reason="needs HIXL_CUDA_DRIVER (a build with CUDA)")

N = (3 << 20) + 7


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


class DeviceArray:
    """Device memory described by the CUDA Array Interface, version 3."""

    def __init__(self, ptr, shape, typestr="|u1", strides=None, readonly=False):
        self.__cuda_array_interface__ = {
            "data": (ptr, readonly), "shape": shape, "typestr": typestr,
            "strides": strides, "version": 3}


@pytest.fixture
def engines():
    made = []

    def make(**opts):
        h = hixl.Hixl()
        h.initialize("127.0.0.1:0", {k: str(v) for k, v in opts.items()})
        made.append(h)
        return h
    yield make
    for h in reversed(made):
        h.finalize()


def test_device_arrays_register_without_copy_and_move_over_tcp(engines):
    # A third engine only owns the device memory; the two others register
    # parts of it as the application's own device buffers.
    store = engines()
    base = store.alloc_mem(2 * N + 4096, hixl.MemType.MEM_DEVICE)
    a, b = engines(LinkType="TCP"), engines(LinkType="TCP")
    mine = DeviceArray(base, (N,))
    theirs = DeviceArray(base + N + 4096, ((N - 7) // 8, 8),
                         strides=(8, 1))  # 2-D, C-contiguous strides given
    size = ((N - 7) // 8) * 8
    assert hixl.address_of(mine) == (base, N)
    assert hixl.address_of(theirs) == (base + N + 4096, size)
    a.register_mem(mine)     # MEM_DEVICE chosen from the object
    b.register_mem(theirs)
    a.connect(b.local_engine(), timeout_ms=5000)
    remote = base + N + 4096

    # host -> peer device, and back into host memory.
    src = pattern(size, 1)
    a.transfer_sync(b.local_engine(), hixl.TransferOp.WRITE,
                    [(int(src.ctypes.data), remote, size)], timeout_ms=10000)
    back = np.zeros(size, dtype=np.uint8)
    a.transfer_sync(b.local_engine(), hixl.TransferOp.READ,
                    [(int(back.ctypes.data), remote, size)], timeout_ms=10000)
    assert np.array_equal(back, src)

    # peer device -> local device; new bytes to the peer; local device -> peer.
    a.transfer_sync(b.local_engine(), hixl.TransferOp.READ, [(base, remote, size)],
                    timeout_ms=10000)
    zeros = np.zeros(size, dtype=np.uint8)
    a.transfer_sync(b.local_engine(), hixl.TransferOp.WRITE,
                    [(int(zeros.ctypes.data), remote, size)], timeout_ms=10000)
    a.transfer_sync(b.local_engine(), hixl.TransferOp.WRITE, [(base, remote, size)],
                    timeout_ms=10000)
    back[:] = 0
    a.transfer_sync(b.local_engine(), hixl.TransferOp.READ,
                    [(int(back.ctypes.data), remote, size)], timeout_ms=10000)
    assert np.array_equal(back, src)


def test_device_arrays_bad_input_is_refused(engines):
    store = engines()
    base = store.alloc_mem(1 << 20, hixl.MemType.MEM_DEVICE)
    h = engines()

    def refused(fn, says):
        with pytest.raises(hixl.HixlError) as ei:
            fn()
        assert ei.value.code_name == "PARAM_INVALID", str(ei.value)
        assert says in str(ei.value), str(ei.value)

    refused(lambda: h.register_mem(DeviceArray(base, (16, 16), strides=(1, 16))),
            "not C-contiguous")
    refused(lambda: h.register_mem(DeviceArray(base, (0,))), "empty")
    refused(lambda: h.register_mem(DeviceArray(0, (16,))), "pointer is 0")
    refused(lambda: h.register_mem(DeviceArray(base, (16,), typestr="<x")), "typestr")
    masked = DeviceArray(base, (16,))
    masked.__cuda_array_interface__["mask"] = DeviceArray(base, (16,))
    refused(lambda: h.register_mem(masked), "masked")
    # The CPU never copies device memory.
    host = np.zeros(16, dtype=np.uint8)
    refused(lambda: hixl._hixl.memmove(host, DeviceArray(base, (16,)), 16), "CUDA device memory")
    refused(lambda: hixl._hixl.memmove(DeviceArray(base, (16,)), host, 16), "CUDA device memory")
    # Device memory as host memory, and host memory as device memory.
    refused(lambda: h.register_mem(DeviceArray(base, (4096,)), type=hixl.MemType.MEM_HOST),
            "MEM_DEVICE")
    refused(lambda: h.register_mem(np.zeros(4096, dtype=np.uint8),
                                   type=hixl.MemType.MEM_DEVICE), "host memory")
    # Past the end of the allocation.
    refused(lambda: h.register_mem(DeviceArray(base + 4096, (1 << 20,))), "past the end")


def test_stream_argument_is_checked(engines):
    store = engines()
    base = store.alloc_mem(1 << 20, hixl.MemType.MEM_DEVICE)
    a, b = engines(LinkType="TCP"), engines(LinkType="TCP")
    a.register_mem(DeviceArray(base, (4096,)))
    b.register_mem(DeviceArray(base + 8192, (4096,)))
    a.connect(b.local_engine(), timeout_ms=5000)
    desc = [(base, base + 8192, 4096)]

    class TorchLikeStream:
        cuda_stream = 0xdead0

    for bad, says in (("x", "stream must be"), (0, "stream 0"), (True, "stream must be"),
                      (0xdead0, "TransferArgs.stream"), (TorchLikeStream(), "TransferArgs.stream")):
        with pytest.raises(hixl.HixlError) as ei:
            a.transfer_sync(b.local_engine(), hixl.TransferOp.WRITE, desc, stream=bad)
        assert ei.value.code_name == "PARAM_INVALID", str(ei.value)
        assert says in str(ei.value), str(ei.value)
        with pytest.raises(hixl.HixlError):
            a.transfer_async(b.local_engine(), hixl.TransferOp.WRITE, desc, stream=bad)
    a.transfer_sync(b.local_engine(), hixl.TransferOp.WRITE, desc, stream=None)


def test_llm_datadist_device_caches_move_blocks_over_tcp(engines):
    """LLM-DataDist caches of device arrays: their placement follows the
    objects (Placement.DEVICE), blocks move device -> device between two
    instances, and the bytes are read back through a hixl engine."""
    import llm_datadist as ldd
    blocks, block_bytes, tensors = 16, 4096 + 32, 2
    tbytes = blocks * block_bytes
    store = engines()
    base = store.alloc_mem(4 * tbytes + 4096, hixl.MemType.MEM_DEVICE)
    src_addr = [base + i * tbytes for i in range(tensors)]
    dst_addr = [base + (2 + i) * tbytes for i in range(tensors)]
    # Fill the source tensors (host -> device through a reader engine).
    reader, owner = engines(LinkType="TCP"), engines(LinkType="TCP")
    owner.register_mem(DeviceArray(base, (4 * tbytes,)))
    reader.connect(owner.local_engine(), timeout_ms=5000)
    src_bytes = [pattern(tbytes, 10 + i) for i in range(tensors)]
    for a, b in zip(src_addr, src_bytes):
        reader.transfer_sync(owner.local_engine(), hixl.TransferOp.WRITE,
                             [(int(b.ctypes.data), a, tbytes)], timeout_ms=10000)

    cfg = '{"LinkType":"TCP"}'
    prompt = ldd.LLMDataDist(ldd.LLMRole.PROMPT, cluster_id=1)
    decoder = ldd.LLMDataDist(ldd.LLMRole.DECODER, cluster_id=2)
    try:
        pc = ldd.LLMConfig()
        pc.listen_ip_info = "127.0.0.1:0"
        pc.global_resource_config = cfg
        prompt.init(pc.generate_options())
        dc = ldd.LLMConfig()
        dc.global_resource_config = cfg
        decoder.init(dc.generate_options())
        desc = ldd.CacheDesc(tensors, [blocks, block_bytes], ldd.DataType.DT_UINT8)
        assert desc.placement == ldd.Placement.DEVICE
        src = prompt.cache_manager.register_blocks_cache(
            desc, [DeviceArray(a, (tbytes,)) for a in src_addr], ldd.BlocksCacheKey(1, 0))
        dst = decoder.cache_manager.register_blocks_cache(
            desc, [DeviceArray(a, (tbytes,)) for a in dst_addr])
        assert src.tensor_addrs == src_addr and dst.tensor_addrs == dst_addr
        # Placement.HOST for CUDA memory, and a mix of host and device, are refused.
        with pytest.raises(ldd.LLMException) as ei:
            decoder.cache_manager.register_blocks_cache(
                ldd.CacheDesc(tensors, [blocks, block_bytes], ldd.DataType.DT_UINT8,
                              ldd.Placement.HOST),
                [DeviceArray(a, (tbytes,)) for a in dst_addr])
        assert "CUDA memory" in str(ei.value)
        with pytest.raises(ldd.LLMException) as ei:
            decoder.cache_manager.register_blocks_cache(
                desc, [DeviceArray(dst_addr[0], (tbytes,)), np.zeros(tbytes, dtype=np.uint8)])
        assert "not a mix" in str(ei.value)

        cluster = ldd.LLMClusterInfo()
        cluster.remote_cluster_id = 1
        host, port = prompt.local_address.rsplit(":", 1)
        cluster.append_remote_ip_info(host, int(port))
        ret, _ = decoder.link_clusters([cluster], timeout=5000)
        assert ret == ldd.LLMStatusCode.LLM_SUCCESS
        decoder.cache_manager.pull_blocks(ldd.BlocksCacheKey(1, 0), dst,
                                          src_blocks=[1, 2, 3, 9], dst_blocks=[4, 5, 6, 0])
        for i in range(tensors):
            got = np.zeros(tbytes, dtype=np.uint8)
            reader.transfer_sync(owner.local_engine(), hixl.TransferOp.READ,
                                 [(int(got.ctypes.data), dst_addr[i], tbytes)], timeout_ms=10000)
            want = src_bytes[i].reshape(blocks, block_bytes)
            got = got.reshape(blocks, block_bytes)
            for s, d in ((1, 4), (2, 5), (3, 6), (9, 0)):
                assert np.array_equal(got[d], want[s]), (i, s, d)
    finally:
        decoder.finalize()
        prompt.finalize()
