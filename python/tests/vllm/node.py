"""One vLLM instance for the connector tests: vLLM's real v1 Scheduler with
HixlConnector in the scheduler role, and HixlConnector in the worker role
over CPU KV tensors laid out as vLLM's CPU attention backend lays them out
(one tensor per layer: blocks, KV heads, block size, 2 x head size). The
model runner is played by this file: each step it calls the worker role as
vLLM's KVConnectorModelRunnerMixin does (bind, start_load_kv, wait_for_save,
get_transfer_results, get_block_ids_with_load_errors, clear), writes each
computed token's K and V into the request's blocks (a value derived from
the token, its position and the layer), samples a fixed token, and hands
vLLM's scheduler a real ModelRunnerOutput.

Started by the tests in a process of its own (multiprocessing, spawn); the
test calls its methods through a pipe (Node.serve)."""
import json
import os
import time
import traceback

NUM_LAYERS = 2
KV_HEADS = 2
HEAD_SIZE = 32


def write_model_dir(path, layers=NUM_LAYERS, kv_heads=KV_HEADS, head_size=HEAD_SIZE):
    os.makedirs(path, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "hidden_size": 2 * kv_heads * head_size, "intermediate_size": 128,
           "num_attention_heads": 2 * kv_heads, "num_key_value_heads": kv_heads,
           "head_dim": head_size, "num_hidden_layers": layers, "vocab_size": 4096,
           "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "torch_dtype": "float32",
           "bos_token_id": 1, "eos_token_id": 2}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return path


def kv_value(token, pos, layer):
    """What the played model writes for one token (exact in float32)."""
    return float(((token * 131 + pos) * 8 + layer) % (1 << 22) + 1)


class Node:
    def __init__(self, model_dir, kv_role, extra, *, block_size=16, num_blocks=64,
                 head_size=HEAD_SIZE, max_num_batched_tokens=256, prefix_caching=True):
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig,
                                 SchedulerConfig, VllmConfig)
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor)
        from vllm.v1.structured_output import StructuredOutputManager

        self.torch = torch
        mc = ModelConfig(model=model_dir, tokenizer=None, skip_tokenizer_init=True,
                         dtype="float32", seed=0, max_model_len=1024)
        sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_num_batched_tokens,
                             max_model_len=1024, is_encoder_decoder=False)
        cc = CacheConfig(block_size=block_size, cache_dtype="auto",
                         enable_prefix_caching=prefix_caching)
        kvt = KVTransferConfig(kv_connector="HixlConnector",
                               kv_connector_module_path="llm_datadist.vllm_connector",
                               kv_role=kv_role, kv_connector_extra_config=extra)
        self.vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc,
                             kv_transfer_config=kvt, device_config=DeviceConfig("cpu"))
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=KV_HEADS,
                                 head_size=head_size, dtype=torch.float32)
        names = ["model.layers.%d.self_attn.attn" % i for i in range(NUM_LAYERS)]
        page = spec.page_size_bytes
        self.kcc = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[KVCacheTensor(size=page * num_blocks, layers=[n],
                                            layer_stride=page * num_blocks, block_stride=page)
                              for n in names],
            kv_cache_groups=[KVCacheGroupSpec(names, spec)])
        cc.num_gpu_blocks = num_blocks
        self.block_size, self.num_blocks = block_size, num_blocks
        self.sched = Scheduler(vllm_config=self.vc, kv_cache_config=self.kcc,
                               structured_output_manager=StructuredOutputManager(self.vc),
                               block_size=block_size, log_stats=True)
        hash_fn = get_hash_fn_by_name(cc.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        # The worker role, built the way vLLM's worker builds it.
        self.worker = KVConnectorFactory.create_connector(self.vc, KVConnectorRole.WORKER,
                                                          self.kcc)
        # CPU attention's KV layout, poisoned so that blocks nobody wrote show.
        self.kv = {n: torch.full((num_blocks, KV_HEADS, block_size, 2 * head_size), -1.0,
                                 dtype=torch.float32) for n in names}
        self.names = names
        self.worker.register_kv_caches(self.kv)
        meta = self.worker.get_handshake_metadata()
        self.sched.connector.set_xfer_handshake_metadata_pp_aware({(0, 0): meta})
        self.finished = {}      # request id -> kv_transfer_params of its last output
        self.checked = {}       # request id -> [bad block index] of its remote prompt KV
        self.remote = set()     # request ids whose prompt KV should have arrived
        self.load_errors = set()
        self.stats = {}

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
        positions before the last one what the prefill wrote, block by block?"""
        self.remote.discard(rid)
        n = len(req.prompt_token_ids) - 1
        bad = []
        for b in range((n + self.block_size - 1) // self.block_size):
            ok = True
            for p in range(b * self.block_size, min(n, (b + 1) * self.block_size)):
                tok = req.prompt_token_ids[p]
                for li, name in enumerate(self.names):
                    row = self.kv[name][blocks[b], :, p % self.block_size, :]
                    if not bool((row == kv_value(tok, p, li)).all()):
                        ok = False
            if not ok:
                bad.append(b)
        self.checked[rid] = bad

    def step(self):
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        out = self.sched.schedule()
        w = self.worker
        w.bind_connector_metadata(out.kv_connector_metadata)
        t0 = time.monotonic()
        w.start_load_kv(None)
        self.stats["start_load_kv_max_s"] = max(self.stats.get("start_load_kv_max_s", 0.0),
                                                time.monotonic() - t0)
        req_ids, sampled = [], []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            blocks = self.sched.kv_cache_manager.get_block_ids(rid)[0]
            if rid in self.remote:
                self._check_remote(rid, req, blocks)
            end = req.num_computed_tokens
            toks = req.all_token_ids
            for p in range(end - n, end):
                for li, name in enumerate(self.names):
                    self.kv[name][blocks[p // self.block_size], :, p % self.block_size, :] = \
                        kv_value(toks[p], p, li)
            req_ids.append(rid)
            sampled.append([3000 + req.num_output_tokens] if end >= req.num_tokens else [])
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
        mro = ModelRunnerOutput(req_ids=req_ids,
                                req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                sampled_token_ids=sampled, kv_connector_output=kvo)
        for eco in self.sched.update_from_output(out, mro).values():
            for o in eco.outputs:
                if o.finished:
                    self.finished[o.request_id] = o.kv_transfer_params
        return len(req_ids)

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

    def state(self):
        pool = self.sched.kv_cache_manager.block_pool
        return {"requests": sorted(self.sched.requests), "free_blocks": pool.get_num_free_blocks(),
                "blocks": self.num_blocks, "checked": dict(self.checked),
                "load_errors": sorted(self.load_errors), "stats": dict(self.stats),
                "finished": sorted(self.finished),
                "errors": list(self.worker._worker.recent_errors)}

    def clear(self):
        """Forgets what earlier tests left: load errors, checks, messages."""
        self.load_errors.clear()
        self.checked.clear()
        self.worker._worker.recent_errors.clear()

    def read_kv(self, block, layer=0):
        return self.kv[self.names[layer]][block].flatten().tolist()

    def shutdown(self):
        self.worker.shutdown()
        self.worker.shutdown()   # idempotent
        return True


def serve(conn, args, kwargs):
    """The node process: builds a Node, then answers (method, args, kwargs)
    calls with ("ok", result) or ("error", traceback text) until "exit"."""
    try:
        node = Node(*args, **kwargs)
        conn.send(("ok", None))
    except BaseException:  # noqa: BLE001
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "exit":
            break
        name, a, kw = msg
        try:
            conn.send(("ok", getattr(node, name)(*a, **kw)))
        except BaseException:  # noqa: BLE001
            conn.send(("error", traceback.format_exc()))
    try:
        node.shutdown()
    except Exception:  # noqa: BLE001
        pass
