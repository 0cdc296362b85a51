"""Imports the installed hixl and llm_datadist packages (from wherever the
interpreter finds them) and moves bytes with each: a loopback WRITE through
hixl, and a block pull between two LLM-DataDist instances."""
import sys

import numpy as np

import hixl
import llm_datadist as ldd

print("hixl from", hixl.__file__, "llm_datadist from", ldd.__file__)
h = hixl.Hixl()
h.initialize("127.0.0.1:0")
dst = np.zeros(4096, np.uint8)
src = np.full(4096, 7, np.uint8)
h.register_mem(dst.ctypes.data, dst.nbytes, hixl.MemType.MEM_HOST)
h.connect(h.local_engine(), 2000)
h.transfer_sync(h.local_engine(), hixl.TransferOp.WRITE, [(src.ctypes.data, dst.ctypes.data, 4096)], 2000)
assert (dst == 7).all(), "hixl WRITE moved the wrong bytes"
h.finalize()

prompt = ldd.LLMDataDist(ldd.LLMRole.PROMPT, 1)
cfg = ldd.LLMConfig()
cfg.listen_ip_info = "127.0.0.1:0"
prompt.init(cfg.generate_options())
decode = ldd.LLMDataDist(ldd.LLMRole.DECODER, 2)
decode.init(ldd.LLMConfig().generate_options())
desc = ldd.CacheDesc(2, [4, 256], ldd.DataType.DT_FLOAT)
k, v = np.arange(1024, dtype=np.float32).reshape(4, 256), -np.arange(1024, dtype=np.float32).reshape(4, 256)
prompt.cache_manager.register_blocks_cache(desc, [k, v], ldd.BlocksCacheKey(1, 0))
dk, dv = np.zeros((4, 256), np.float32), np.zeros((4, 256), np.float32)
mine = decode.cache_manager.register_blocks_cache(desc, [dk, dv], ldd.BlocksCacheKey(2, 0))
ci = ldd.LLMClusterInfo()
ci.remote_cluster_id = 1
host, port = prompt.local_address.rsplit(":", 1)
ci.append_remote_ip_info(host, int(port))
status, rets = decode.link_clusters([ci])
assert status == ldd.LLMStatusCode.LLM_SUCCESS, rets
decode.cache_manager.pull_blocks(ldd.BlocksCacheKey(1, 0), mine, [3, 1], [0, 1])
assert (dk[0] == k[3]).all() and (dv[1] == v[1]).all(), "pull_blocks moved the wrong bytes"
decode.finalize()
prompt.finalize()

# SGLang finds its transfer backend through the package's entry point (in the
# dist-info pip or `cmake --install` wrote); its modules import without SGLang.
from importlib.metadata import entry_points  # noqa: E402
eps = [e.value for e in entry_points(group="sglang.srt.plugins") if e.name == "hixl"]
assert eps == ["hixl.sglang:register"], "SGLang plugin entry point: %r" % eps
import hixl.sglang._descs  # noqa: E402,F401
import hixl.sglang._wire  # noqa: E402,F401
print("installed packages work")
sys.exit(0)
