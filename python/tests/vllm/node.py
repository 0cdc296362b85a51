"""vLLM instances for the connector tests: vLLM's real v1 Scheduler with
HixlConnector in the scheduler role, and HixlConnector in the worker role --
one per tensor-parallel rank -- over CPU KV tensors laid out as vLLM's CPU
attention backend lays them out (one tensor per layer: blocks, KV heads,
block size, 2 x head size; or tokens before heads, or an MLA latent). The
model runner is played by this file: each step it calls each worker role as
vLLM's KVConnectorModelRunnerMixin does (bind; start_load_kv before the
forward only when a load feeds it, else after it; save_kv_layer after each
layer; wait_for_save, get_transfer_results, get_block_ids_with_load_errors,
clear), writes each computed token's K and V into the request's blocks (a
value derived from the token, its position, the layer and the KV head),
layer by layer, samples a fixed token, and hands vLLM's scheduler the ranks'
ModelRunnerOutputs merged by vLLM's own KVOutputAggregator.

The tests start processes (multiprocessing, spawn) running serve(); each
holds several Nodes by name and answers calls through a pipe. Tensor
parallelism is played in one process: the connector's _tp hook gives each
worker its rank, as vLLM's parallel state would."""
import json
import os
import time
import traceback

NUM_LAYERS = 2
KV_HEADS = 4          # in all; a rank holds KV_HEADS / tp
HEAD_SIZE = 32
LATENT = 96           # MLA: one latent vector per token
WINDOW = 32           # hybrid: the sliding window of every other layer, in tokens


def write_model_dir(path):
    os.makedirs(path, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": 2 * KV_HEADS * HEAD_SIZE, "intermediate_size": 128,
           "num_attention_heads": 2 * KV_HEADS, "num_key_value_heads": KV_HEADS,
           "head_dim": HEAD_SIZE, "num_hidden_layers": NUM_LAYERS, "vocab_size": 4096,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
           "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


def kv_value(token, pos, layer, head):
    """What the played model writes for one token and KV head (exact in float32)."""
    return float((((token * 131 + pos) * 8 + layer) * 8 + head) % (1 << 22) + 1)


class Node:
    def __init__(self, model_dir, kv_role, extra, *, block_size=16, num_blocks=64, tp=1,
                 order="HN", mla=False, prefix_caching=True, hybrid=False, staging=False,
                 cross_layer=False):
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        import llm_datadist.vllm_connector as hc
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 SchedulerConfig, VllmConfig)
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor,
                                                MLAAttentionSpec, SlidingWindowSpec)
        from vllm.v1.structured_output import StructuredOutputManager

        self.torch = torch
        mc = ModelConfig(model=model_dir, tokenizer=None, skip_tokenizer_init=True,
                         dtype="float32", seed=0, max_model_len=1024)
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=256, max_model_len=1024,
                             is_encoder_decoder=False)
        cc = CacheConfig(block_size=block_size, cache_dtype="auto",
                         enable_prefix_caching=prefix_caching)
        if staging:     # the KV tensors play a device's; peers move a host copy
            extra = dict(extra, host_buffer="on")
        kvt = KVTransferConfig(kv_connector="HixlConnector",
                               kv_connector_module_path="llm_datadist.vllm_connector",
                               kv_role=kv_role, kv_connector_extra_config=extra)
        self.vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc,
                             kv_transfer_config=kvt, device_config=DeviceConfig("cpu"))
        self.tp, self.mla, self.order = tp, mla, order
        self.heads = 1 if mla else KV_HEADS // tp
        if mla:
            spec = MLAAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=LATENT,
                                    dtype=torch.float32)
        else:
            spec = FullAttentionSpec(block_size=block_size, num_kv_heads=self.heads,
                                     head_size=HEAD_SIZE, dtype=torch.float32)
        page = spec.page_size_bytes
        if hybrid:
            # vLLM's hybrid allocator: full-attention layers (even) and
            # sliding-window ones (odd) in two KV cache groups overlaying the
            # same memory, layer i of one group on layer i of the other.
            names = ["model.layers.%d.self_attn.attn" % i for i in range(2 * NUM_LAYERS)]
            sw = SlidingWindowSpec(block_size=block_size, num_kv_heads=self.heads,
                                   head_size=HEAD_SIZE, dtype=torch.float32,
                                   sliding_window=WINDOW)
            groups = [KVCacheGroupSpec(names[0::2], spec), KVCacheGroupSpec(names[1::2], sw)]
        else:
            names = ["model.layers.%d.self_attn.attn" % i for i in range(NUM_LAYERS)]
            groups = [KVCacheGroupSpec(names, spec)]
        self.kcc = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[KVCacheTensor(size=page * num_blocks * NUM_LAYERS,
                                            layers=list(g.layer_names),
                                            layer_stride=page if cross_layer else
                                            page * num_blocks,
                                            block_stride=page * NUM_LAYERS if cross_layer else
                                            page)
                              for g in groups],
            kv_cache_groups=groups)
        self.group_of = {n: gi for gi, g in enumerate(groups) for n in g.layer_names}
        self.window = {n: WINDOW if gi else None for n, gi in self.group_of.items()}
        cc.num_gpu_blocks = num_blocks
        self.block_size, self.num_blocks, self.names = block_size, num_blocks, names
        self.vc.parallel_config.tensor_parallel_size = tp   # what the scheduler role reads
        real_tp = hc._tp
        try:
            self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=self.kcc,
                                   structured_output_manager=StructuredOutputManager(self.vc),
                                   block_size=block_size, log_stats=True)
            # The worker roles, built the way vLLM's workers build them.
            self.workers, self.kv = [], []
            for rank in range(tp):
                hc._tp = lambda cfg, rank=rank: (rank, tp)
                w = KVConnectorFactory.create_connector(self.vc, KVConnectorRole.WORKER, self.kcc)
                # Poisoned, so that blocks nobody wrote show. Layer i of each
                # group on the same memory.
                n_mem = len(groups[0].layer_names)
                if cross_layer:   # block-outer: block b holds every layer's page
                    big = torch.full((num_blocks, n_mem) + self._shape()[1:], -1.0,
                                     dtype=torch.float32)
                    mem = [big[:, i] for i in range(n_mem)]
                else:
                    mem = [torch.full(self._shape(), -1.0, dtype=torch.float32)
                           for _ in range(n_mem)]
                kv = {n: mem[list(g.layer_names).index(n)] for g in groups for n in g.layer_names}
                w.register_kv_caches(kv)
                if staging:
                    w.set_host_xfer_buffer_ops(self._copy_blocks)   # as vLLM's runner does
                self.workers.append(w)
                self.kv.append(kv)
        finally:
            hc._tp = real_tp
        self.sched.connector.set_xfer_handshake_metadata_pp_aware(
            {(0, r): w.get_handshake_metadata() for r, w in enumerate(self.workers)})
        self.aggregator = KVOutputAggregator(tp)
        hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        self.finished = {}      # request id -> kv_transfer_params of its last output
        self.checked = {}       # request id -> [bad block index] of its remote prompt KV
        self.remote = set()     # request ids whose prompt KV should have arrived
        self.load_errors = set()
        self.stats = {}
        self.layer_delay = 0.0  # seconds each layer of a forward takes (set_layer_delay)

    def _copy_blocks(self, src, dst, src_ids, dst_ids, direction):
        """The copy operation vLLM's model runner hands the connector
        (set_host_xfer_buffer_ops), counted: blocks index the first dimension."""
        assert direction in ("d2h", "h2d") and len(src_ids) == len(dst_ids)
        for k, t in src.items():
            dst[k][dst_ids] = t[src_ids]
        key = direction + "_blocks"
        self.stats[key] = self.stats.get(key, 0) + len(src_ids)

    def _shape(self):
        b, h = self.block_size, self.heads
        if self.mla:
            return (self.num_blocks, b, LATENT)
        if self.order == "HN":
            return (self.num_blocks, h, b, 2 * HEAD_SIZE)
        return (self.num_blocks, b, h, 2 * HEAD_SIZE)

    def _rows(self, kv_layer, block, slot):
        """[(global head, row tensor)] of one token slot of one block."""
        if self.mla:
            return [(0, kv_layer[block, slot, :])]
        r0 = self._rank * self.heads
        if self.order == "HN":
            return [(r0 + j, kv_layer[block, j, slot, :]) for j in range(self.heads)]
        return [(r0 + j, kv_layer[block, slot, j, :]) for j in range(self.heads)]

    # -- requests
    def add(self, rid, prompt, params=None, max_tokens=1):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                            extra_args={"kv_transfer_params": params} if params else None)
        r = Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=sp,
                    pooling_params=None, block_hasher=self.hasher)
        self.sched.add_request(r)
        if params and params.get("do_remote_prefill"):
            self.remote.add(rid)

    def abort(self, rid):
        from vllm.v1.request import RequestStatus
        self.sched.finish_requests(rid, RequestStatus.FINISHED_ABORTED)
        self.finished[rid] = None   # vLLM's engine answers an abort itself

    # -- the played model runner
    def _check_remote(self, rid, req, blocks):
        """The first time a remote-prefill request runs: are the prompt's
        positions before the last one what the prefill wrote, block by
        block, on every rank and KV head?"""
        self.remote.discard(rid)
        n = len(req.prompt_token_ids) - 1
        bad = []
        for b in range((n + self.block_size - 1) // self.block_size):
            ok = True
            for self._rank, kv in enumerate(self.kv):
                for p in range(b * self.block_size, min(n, (b + 1) * self.block_size)):
                    tok = req.prompt_token_ids[p]
                    for li, name in enumerate(self.names):
                        w = self.window[name]
                        block = blocks[self.group_of[name]][b]
                        if w is not None and (p < n + 1 - w + 1 or block == 0):
                            # Before the window the prefill kept (vLLM frees
                            # tokens below num_computed - window + 1 first).
                            continue
                        for g, row in self._rows(kv[name], block, p % self.block_size):
                            if not bool((row == kv_value(tok, p, li, g)).all()):
                                ok = False
            if not ok:
                bad.append(b)
        self.checked[rid] = bad

    def step(self):
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        out = self.sched.schedule()
        for w in self.workers:
            w.bind_connector_metadata(out.kv_connector_metadata)
        # vLLM starts the loads before the forward only when one feeds it;
        # else after it, just before wait_for_save.
        sync_loads = getattr(out, "has_sync_kv_loads", True)
        if sync_loads:
            self._start_load_kv()
        req_ids, sampled, work = [], [], []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            blocks = self.sched.kv_cache_manager.get_block_ids(rid)     # per group
            if rid in self.remote:
                self._check_remote(rid, req, blocks)
            end = req.num_computed_tokens
            work.append((req.all_token_ids, blocks, end - n, end))
            req_ids.append(rid)
            sampled.append([3000 + req.num_output_tokens] if end >= req.num_tokens else [])
        # The forward, layer by layer: each layer's K and V of the step's
        # tokens, then save_kv_layer, as vLLM's attention layers call it.
        for li, name in enumerate(self.names):
            for toks, blocks, first, end in work:
                for p in range(first, end):
                    block = blocks[self.group_of[name]][p // self.block_size]
                    if block == 0:
                        continue    # the null block: a window's dropped tokens
                    for self._rank, kv in enumerate(self.kv):
                        for g, row in self._rows(kv[name], block, p % self.block_size):
                            row.fill_(kv_value(toks[p], p, li, g))
            for w, kv in zip(self.workers, self.kv):
                w.save_kv_layer(name, kv[name], None)
            if work and self.layer_delay:
                time.sleep(self.layer_delay)
        if not sync_loads:
            self._start_load_kv()
        outputs = []
        for w in self.workers:
            w.wait_for_save()
            res = w.get_transfer_results(out.finished_req_ids)
            invalid = w.get_block_ids_with_load_errors()
            self.load_errors |= invalid
            st = w.get_kv_connector_stats()
            if st is not None:
                for k, v in st.reduce().items():
                    self.stats[k] = self.stats.get(k, 0) + v
            w.clear_connector_metadata()
            kvo = KVConnectorOutput(finished_sending=res.finished_sending or None,
                                    finished_recving=res.finished_recving or None,
                                    invalid_block_ids=invalid, failed_recving=res.failed_recving)
            outputs.append(ModelRunnerOutput(
                req_ids=list(req_ids), req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=[list(s) for s in sampled], kv_connector_output=kvo))
        mro = self.aggregator.aggregate(outputs, 0)
        for eco in self.sched.update_from_output(out, mro).values():
            for o in eco.outputs:
                if o.finished:
                    self.finished[o.request_id] = o.kv_transfer_params
        return len(req_ids)

    def _start_load_kv(self):
        for w in self.workers:
            t0 = time.monotonic()
            w.start_load_kv(None)
            self.stats["start_load_kv_max_s"] = max(self.stats.get("start_load_kv_max_s", 0.0),
                                                    time.monotonic() - t0)

    def run(self, until=(), idle=False, timeout=30.0):
        """Steps until every request in until finished (and, with idle, the
        scheduler holds no request at all) -> {request id: kv_transfer_params}."""
        deadline = time.monotonic() + timeout
        while True:
            done = all(r in self.finished for r in until)
            # Like vLLM's engine loop: step while the scheduler has anything,
            # finished requests still to hand to the workers included.
            if done and (not idle or not self.sched.has_requests()):
                return {r: self.finished[r] for r in until}
            if time.monotonic() > deadline:
                raise TimeoutError("not finished in %.0f s: %s; scheduler holds %s"
                                   % (timeout, [r for r in until if r not in self.finished],
                                      sorted(self.sched.requests)))
            if self.step() == 0:
                time.sleep(0.002)

    def draining(self):
        """True while the scheduler holds only finished requests whose blocks
        wait for the connector: vLLM's engine keeps stepping then, with no
        request to schedule (Scheduler.has_requests)."""
        return not self.sched.has_unfinished_requests() and self.sched.has_finished_requests()

    def state(self):
        pool = self.sched.kv_cache_manager.block_pool
        return {"requests": sorted(self.sched.requests), "free_blocks": pool.get_num_free_blocks(),
                "blocks": self.num_blocks, "checked": dict(self.checked),
                "load_errors": sorted(self.load_errors), "stats": dict(self.stats),
                "finished": sorted(self.finished),
                "errors": [e for w in self.workers for e in w._worker.recent_errors]}

    def asked(self, xid):
        """How many decode ranks' asks for transfer xid the workers took
        (concurrent routing) or keep for later."""
        n = 0
        for w in self.workers:
            with w._worker._lock:
                st = w._worker._lw.get(xid)
                n += len(st.asks) if st is not None else 0
                n += len(w._worker._early.get(xid, ()))
        return n

    def set_layer_delay(self, seconds):
        self.layer_delay = float(seconds)

    def clear(self):
        """Forgets what earlier tests left: load errors, checks, messages."""
        self.load_errors.clear()
        self.checked.clear()
        for w in self.workers:
            w._worker.recent_errors.clear()

    def handshake_check(self):
        """Rank 0's handshake metadata, and what a second register_kv_caches says."""
        w = self.workers[0]
        meta = w.get_handshake_metadata()
        try:
            w.register_kv_caches(self.kv[0])
            again = None
        except RuntimeError as e:
            again = str(e)
        return {"address": meta.address, "tp_rank": meta.tp_rank, "layout": meta.layout,
                "again": again}

    def sleep(self):
        """vLLM's sleep mode around the connector: registrations dropped."""
        for w in self.workers:
            w.unregister_kv_caches()
            w.unregister_kv_caches()   # idempotent

    def wake(self):
        for w in self.workers:
            w.restore_kv_caches()
            w.restore_kv_caches()

    def shutdown(self):
        for w in self.workers:
            w.shutdown()
            w.shutdown()   # idempotent
        return True


def serve(conn):
    """A node process: ("new", name, args, kwargs) builds a Node; (name,
    method, args, kwargs) calls one; ("drop", name) shuts one down; "exit"
    ends. Each answer is ("ok", result) or ("error", traceback text)."""
    nodes = {}
    while True:
        try:
            # Between calls, nodes holding finished requests step on their
            # own, as a serving engine does (a prefill frees, or in push mode
            # writes, while the test talks to the decode).
            while not conn.poll(0.005 if any(n.draining() for n in nodes.values()) else None):
                for n in nodes.values():
                    if n.draining():
                        try:
                            n.step()
                        except Exception:  # noqa: BLE001 -- the next call says it again
                            traceback.print_exc()
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "exit":
            break
        try:
            if msg[0] == "new":
                _, name, a, kw = msg
                nodes[name] = Node(*a, **kw)
                result = None
            elif msg[0] == "drop":
                result = nodes.pop(msg[1]).shutdown()
            else:
                name, method, a, kw = msg
                result = getattr(nodes[name], method)(*a, **kw)
            conn.send(("ok", result))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
    for n in nodes.values():
        try:
            n.shutdown()
        except Exception:  # noqa: BLE001
            pass
