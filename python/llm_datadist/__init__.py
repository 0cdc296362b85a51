"""llm_datadist: KV caches moved between the prefill ("prompt") and decode
processes of a disaggregated LLM service, by one-sided reads and writes of
the hixl engine. The names follow the published LLM-DataDist Python API, so
code written for it (e.g. vllm-ascend-style connectors) ports; extensions are
marked as such in the docstrings.

The LLM-DataDist API::

    import llm_datadist as ldd
    dd = ldd.LLMDataDist(ldd.LLMRole.DECODER, cluster_id=2)
    cfg = ldd.LLMConfig()
    cfg.listen_ip_info = "127.0.0.1:26000"       # optional: peers may link to us
    dd.init(cfg.generate_options())
    cluster = ldd.LLMClusterInfo()
    cluster.remote_cluster_id = 1
    cluster.append_remote_ip_info("127.0.0.1", 26001)
    ret, rets = dd.link_clusters([cluster], timeout=3000)
    cm = dd.cache_manager
    desc = ldd.CacheDesc(num_tensors=2, shape=[64, 4096], data_type=ldd.DataType.DT_FLOAT16)
    cache = cm.register_blocks_cache(desc, [k_array, v_array])      # numpy / torch (CPU or CUDA) / int
    cm.pull_blocks(ldd.BlocksCacheKey(1, model_id=0), cache, src_blocks=[3, 4], dst_blocks=[0, 1])
    dd.finalize()

* LLMDataDist(role, cluster_id): init(options), finalize() (instances still
  alive are finalized at interpreter exit), link_clusters(clusters,
  timeout=3000) -> (LLMStatusCode, [LLMStatusCode]), unlink_clusters(clusters,
  timeout=3000, force=False), switch_role(role, switch_options=None),
  cache_manager, cluster_id; extensions: role, local_address.
* LLMConfig (alias LlmConfig): listen_ip_info, sync_kv_timeout, device_id,
  enable_cache_manager, enable_remote_cache_accessible, transfer_backend,
  global_resource_config, enable_switch_role, cache_lease_ms,
  share_caches_by_mapping ->
  generate_options().
* LLMClusterInfo: remote_cluster_id, remote_role_type,
  append_local_ip_info(ip, port), append_remote_ip_info(ip, port). An ip is a
  string, or -- as in the published API -- an int whose little-endian bytes
  are the IPv4 octets (127.0.0.1 is 0x0100007F).
* CacheDesc, CacheKey, CacheKeyByIdAndIndex, BlocksCacheKey, Cache,
  TransferConfig, TransferWithCacheKeyConfig, LayerSynchronizer, CacheTask.
* cache_manager: register_cache, register_blocks_cache, unregister_cache,
  pull_cache, pull_blocks, push_cache, push_blocks, transfer_cache_async;
  extensions: get_transfer_events, set_transfer_callback (KvTransferEvent),
  the user_tag= and tensor_num_per_layer= keywords of pulls and pushes,
  allocate_host_memory, and LayerGates (gates of transfer_cache_async that
  its thread waits for without the GIL).
* Layer ranges are Python ranges: range(2, 5) is layers 2, 3 and 4 (step 1
  only); None is every layer.
* Cache memory: int addresses, numpy arrays, CPU torch tensors or any
  writable C-contiguous buffer, used in place (no copies), held while
  registered; non-contiguous or too small objects are refused.
* Enums LLMRole, Placement, DataType, LLMStatusCode (the published values),
  TransferEventKind; every failure raises LLMException (.status_code, and the
  C++ layer's message in str(e)). Engine calls release the GIL.

The publish/subscribe facade (KVCachePublisher, KVCacheSubscriber, CacheId,
CacheDescriptor, SUBSCRIBE_STATUS_*, allocate_host_memory)::

    subscriber = ldd.KVCacheSubscriber()                   # decode process
    subscriber.init(rank_id=0, local_ip="127.0.0.1", local_port=18000)
    recv_buffer = ldd.allocate_host_memory(128 * 1024 * 1024)
    subscriber.register_buffer(recv_buffer)
    cache_id = ldd.CacheId(prompt_hash="abc123", seq_len=512)
    result = subscriber.subscribe(cache_id, timeout_ms=5000)
    if result.status == ldd.SUBSCRIBE_STATUS_SUCCESS:
        kv = subscriber.get_cache_data(cache_id)            # view into recv_buffer

    publisher = ldd.KVCachePublisher()                     # prefill process
    publisher.init(rank_id=0)
    publisher.connect("127.0.0.1", 18000, remote_rank_id=0)
    publisher.publish(ldd.CacheId("abc123", 512), kv_array)

The publisher is told the subscriber's ip, port and rank; it links to it,
claims a region of the subscriber's registered buffer and pushes each
publication into the next free blocks of that region with a user_tag naming
the CacheId. The subscriber's subscribe() waits for the KvTransferEvent of
that push (delivered after the data). Blocks stay taken until the
subscriber's release(cache_id); a full region makes publish() wait, then
raise LLM_OUT_OF_MEMORY. Details: llm_datadist._facade and python/README.md.
"""
from . import _llm_datadist
from ._core import (BlocksCacheKey, Cache, CacheDesc, CacheKey, CacheKeyByIdAndIndex,  # noqa: F401
                    CacheManager, CacheTask, DataType, HostMemory, KvTransferEvent,
                    LayerGates, LayerSynchronizer, LLMClusterInfo, LLMConfig, LlmConfig,
                    LLMDataDist, LLMException, LLMRole, LLMStatusCode, Placement,
                    TransferConfig, TransferEventKind, TransferWithCacheKeyConfig,
                    allocate_host_memory)
from ._facade import (CTRL_MODEL_ID, PUBLISHER_CLUSTER_BASE, RECV_MODEL_ID,  # noqa: F401
                      SUBSCRIBE_STATUS_FAILED, SUBSCRIBE_STATUS_NOT_FOUND,
                      SUBSCRIBE_STATUS_SUCCESS, SUBSCRIBE_STATUS_TIMEOUT, CacheDescriptor, CacheId,
                      KVCachePublisher, KVCacheSubscriber, SubscribeResult)

options = _llm_datadist.options

__all__ = ["LLMDataDist", "LLMConfig", "LlmConfig", "LLMClusterInfo", "LLMRole", "Placement",
           "DataType", "LLMStatusCode", "LLMException", "CacheDesc", "CacheKey",
           "CacheKeyByIdAndIndex", "BlocksCacheKey", "Cache", "CacheManager", "TransferConfig",
           "TransferWithCacheKeyConfig", "LayerSynchronizer", "LayerGates", "CacheTask",
           "KvTransferEvent",
           "TransferEventKind", "HostMemory", "allocate_host_memory", "KVCachePublisher",
           "KVCacheSubscriber", "CacheId", "CacheDescriptor", "SubscribeResult",
           "SUBSCRIBE_STATUS_SUCCESS", "SUBSCRIBE_STATUS_TIMEOUT", "SUBSCRIBE_STATUS_NOT_FOUND",
           "SUBSCRIBE_STATUS_FAILED", "RECV_MODEL_ID", "CTRL_MODEL_ID", "PUBLISHER_CLUSTER_BASE",
           "options"]
