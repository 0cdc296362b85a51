"""HixlConnector: a vLLM KV connector (v1) over LLM-DataDist and the hixl
engine, for prefill/decode disaggregation. Load it without changing vLLM::

    --kv-transfer-config '{"kv_connector": "HixlConnector",
                           "kv_connector_module_path": "llm_datadist.vllm_connector",
                           "kv_role": "kv_producer",          # prefill; decode: kv_consumer
                           "kv_connector_extra_config": {"transport": "tcp"}}'

The decode reads the prompt's KV blocks from the prefill's memory (one-sided
reads; the prefill's application takes no part); the read's completion event,
raised on the prefill after the data, frees the prefill's blocks, and a lease
(lease_ms) frees them if no decode ever reads. Metadata travels in vLLM's
kv_transfer_params (docs/VLLM.md); links between workers are made on first
use and kept. Instances whose tensor parallelism, block size or block layout
differ are paired row by row (_plan). Options (kv_connector_extra_config)
are in _common.DEFAULTS.

Thread safety: vLLM calls the scheduler role from its scheduler thread and the
worker role from its model-runner thread; reads run on the worker's own pool
and events on an LLM-DataDist thread, guarded inside."""
import dataclasses
import logging
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorHandshakeMetadata,
                                                               KVConnectorMetadata,
                                                               KVConnectorRole, SupportsHMA)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from . import _common
from ._common import ConfigError  # noqa: F401

__all__ = ["HixlConnector", "HixlConnectorMetadata", "HixlHandshakeMetadata", "HixlStats",
           "ConfigError"]

_log = logging.getLogger(_common.LOGGER)


@dataclasses.dataclass
class HixlConnectorMetadata(KVConnectorMetadata):
    """One step's orders from the scheduler role to the workers.
    reqs_to_recv: request id -> (RemoteSpec, local blocks to fill, the token
    they start at, whether vLLM waits for it); reqs_to_send: request id -> (transfer id,
    lease end) of prefill requests whose blocks wait for a decode's read."""
    reqs_to_recv: dict = dataclasses.field(default_factory=dict)
    reqs_to_send: dict = dataclasses.field(default_factory=dict)
    reqs_to_save: dict = dataclasses.field(default_factory=dict)   # host staging: request id
                                                                   # -> blocks this step wrote
    # Concurrent routing: request id -> (transfer id, its blocks per group,
    # first token, end token this step computes, prompt length); and the
    # transfer ids of such requests aborted (a decode's ask is refused).
    reqs_to_push: dict = dataclasses.field(default_factory=dict)
    reqs_to_drop: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class HixlHandshakeMetadata(KVConnectorHandshakeMetadata):
    """What a worker tells the scheduler role: its engine's address, its
    cluster id, its tensor-parallel rank, its KV layout and whether it
    transfers a host copy of a device KV cache."""
    address: str
    cluster_id: int
    tp_rank: int
    layout: dict
    host_buffer: bool = False


@dataclasses.dataclass
class HixlStats(KVConnectorStats):
    """Counts since the last report: reads (and their blocks), failed reads,
    releases without data, prefill leases that ended unread."""

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return dict(self.data)

    def is_empty(self):
        return not any(self.data.values())


def _tp(vllm_config):
    """(rank, size) of this worker in its tensor-parallel group."""
    size = vllm_config.parallel_config.tensor_parallel_size
    if size == 1:
        return 0, 1
    from vllm.distributed import parallel_state
    return parallel_state.get_tensor_model_parallel_rank(), size


def _groups(kv_cache_config):
    """(KV cache groups, the index of one of full attention). Groups of
    recurrent state (Mamba and its kin) are refused: their blocks are not
    tokens' KV."""
    groups = list(kv_cache_config.kv_cache_groups) if kv_cache_config is not None else []
    for g in groups:
        kind = type(g.kv_cache_spec).__name__
        if "Mamba" in kind or "SSM" in kind:
            raise ConfigError("HixlConnector: KV cache group of %s (layers %s): recurrent "
                              "state is not supported, only attention KV"
                              % (kind, list(g.layer_names)[:3]))
    local = ("SlidingWindow", "ChunkedLocal")
    full = next((i for i, g in enumerate(groups)
                 if not any(k in type(g.kv_cache_spec).__name__ for k in local)), 0)
    return groups, full


class HixlConnector(KVConnectorBase_V1, SupportsHMA):
    """The connector; vLLM builds one per role. It supports vLLM's hybrid
    allocator (several KV cache groups: full attention beside sliding-window
    or chunked-local attention)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = self._kv_transfer_config
        if ktc.kv_role not in ("kv_producer", "kv_consumer", "kv_both"):
            raise ConfigError("HixlConnector: kv_role must be kv_producer, kv_consumer or "
                              "kv_both, got %r" % (ktc.kv_role,))
        self._opts = _common.options(ktc.kv_connector_extra_config)
        self._engine_id = str(ktc.engine_id)
        self._sched = self._worker = None
        groups, full = _groups(kv_cache_config)
        if role == KVConnectorRole.SCHEDULER:
            # vLLM's scheduler process has no parallel state: the size only.
            from ._scheduler import Scheduler
            self._sched = Scheduler(self._opts, self._engine_id,
                                    vllm_config.cache_config.block_size,
                                    vllm_config.parallel_config.tensor_parallel_size, full)
        else:
            tp_rank, tp_size = _tp(vllm_config)
            from ._worker import Worker
            if kv_cache_config is None:
                raise ConfigError("HixlConnector: the worker role needs the KV cache config")
            spec = groups[full].kv_cache_spec
            sizes = {g.kv_cache_spec.block_size for g in groups}
            if len(sizes) != 1:
                raise ConfigError("HixlConnector: KV cache groups of block sizes %s; one size "
                                  "is supported" % sorted(sizes))
            self._worker = Worker(self._opts, self._engine_id, ktc.kv_role, tp_rank, tp_size,
                                  kv_cache_config.num_blocks,
                                  [n for g in groups for n in g.layer_names],
                                  heads=getattr(spec, "num_kv_heads", 1),
                                  block_tokens=spec.block_size,
                                  mla=type(spec).__name__.startswith("MLA"),
                                  groups=len(groups), kv_buffer_device=ktc.kv_buffer_device)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config):
        """kv_connector_extra_config["kv_cache_layout"], when set: e.g. a
        block-outer layout ("BLHNC"), whose blocks hold every layer's page
        and so move as one descriptor each."""
        ktc = getattr(vllm_config, "kv_transfer_config", None)
        if ktc is None:
            return None
        return _common.options(ktc.kv_connector_extra_config)["kv_cache_layout"] or None

    # ------------------------------------------------------------ worker role
    def register_kv_caches(self, kv_caches):
        self._worker.register_kv_caches(kv_caches)

    def unregister_kv_caches(self):
        if self._worker is not None:
            self._worker.unregister_kv_caches()

    def restore_kv_caches(self):
        if self._worker is not None:
            self._worker.restore_kv_caches()

    def get_handshake_metadata(self):
        if self._worker is None or self._worker._layout is None:
            return None
        h = self._worker.handshake()
        return HixlHandshakeMetadata(h["address"], h["cluster_id"], h["tp_rank"], h["layout"],
                                     h["host_buffer"])

    def bind_connector_metadata(self, connector_metadata):
        """Each step, before the forward pass: the step's layer-wise writes
        (concurrent routing) are posted here, gated layer by layer."""
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, HixlConnectorMetadata):
            self._worker.bind(connector_metadata)

    def start_load_kv(self, forward_context, **kwargs: Any):
        meta = self._get_connector_metadata()
        assert isinstance(meta, HixlConnectorMetadata)
        self._worker.start(meta)

    def wait_for_layer_load(self, layer_name):
        """Reads finish before vLLM schedules the request (it waits in
        WAITING_FOR_REMOTE_KVS): nothing to wait for inside the forward."""
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs: Any):
        """The layer's KV of this step is in place: the layer-wise writes of
        concurrent requests whose decode has asked may send it now."""
        self._worker.layer_saved(layer_name)

    def wait_for_save(self):
        """The step's forward is over (every layer may move); with host
        staging, the blocks this step wrote are copied to host."""
        meta = self._get_connector_metadata()
        if isinstance(meta, HixlConnectorMetadata) and meta.reqs_to_save:
            self._worker.save(meta.reqs_to_save)
        self._worker.step_saved()

    def set_host_xfer_buffer_ops(self, copy_operation):
        """vLLM's copy between the device KV cache and the host copy."""
        if self._worker is not None:
            self._worker.set_copy_op(copy_operation)

    def get_finished(self, finished_req_ids):
        sent, recv = self._worker.finished()
        return (sent or None), (recv or None)

    def get_transfer_results(self, finished_req_ids):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults
        sent, recv = self._worker.finished()
        return KVConnectorTransferResults(finished_sending=sent, finished_recving=recv,
                                          failed_recving=self._worker.failed_recv())

    def get_block_ids_with_load_errors(self):
        return self._worker.load_errors()

    def get_kv_connector_stats(self):
        if self._worker is None:
            return None
        s = HixlStats(data=self._worker.take_stats())
        return None if s.is_empty() else s

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return HixlStats(data=dict(data or {}))

    def shutdown(self):
        if self._worker is not None:
            self._worker.shutdown()

    # --------------------------------------------------------- scheduler role
    def set_xfer_handshake_metadata(self, metadata):
        self._sched.set_handshake({r: dataclasses.asdict(m) if dataclasses.is_dataclass(m) else m
                                   for r, m in metadata.items()})

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        recv, send, save, push, drop = self._sched.build_meta(scheduler_output)
        return HixlConnectorMetadata(reqs_to_recv=recv, reqs_to_send=send, reqs_to_save=save,
                                     reqs_to_push=push, reqs_to_drop=drop)

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):
        return self._sched.request_finished(request, block_ids)

    def get_loaded_kv_cache_group_ids(self, request):
        """A load here fills the request's own blocks of every group."""
        groups = self._kv_cache_config.kv_cache_groups if self._kv_cache_config else [None]
        return tuple(range(len(groups)))
