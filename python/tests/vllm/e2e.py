"""End to end: a prefill vLLM and a decode vLLM serving one tiny Llama with
random weights on this CPU, HixlConnector moving the KV between them, and
examples/vllm/pd_proxy.py routing each request prefill -> decode.

Each prompt is asked twice: of the prefill instance alone (an ordinary,
undisaggregated completion: the reference) and through the proxy. The
answers must be equal token for token (greedy sampling, identical dummy
weights), and the decode must report the prompt's tokens as cached -- read
from the prefill, not computed (its prefix cache has never seen them).
A control shows the comparison has teeth: a decode handed the blocks of
another prompt (wrong KV, read all the same) must answer differently.

    python e2e.py [--transport tcp|shm] [--mode pull|push] [--hybrid] [--host-buffer]
                  [--concurrent] [--big] [--requests N]
                                                           (scripts/vllm-e2e.sh)

Prints one JSON line with the figures; exits 1 on any difference."""
import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
VOCAB = 512
BLOCK = 32


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_model(path, hybrid=False, big=False):
    """A 2-layer Llama with random weights (fixed seed; large enough that the
    answer depends on the context, which vLLM's dummy weights, near zero,
    hardly do) and a word-level tokenizer ("w0" ... "w507"). hybrid: its
    second layer attends to a sliding window of 32 tokens (vLLM then keeps
    two KV cache groups: its hybrid allocator). big: 4 layers of 512, whose
    forward on one core takes long enough that the layer-wise writes of
    concurrent routing can be seen overlapping it."""
    import torch
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    os.makedirs(path, exist_ok=True)
    hidden, inter, heads, kv_heads, hd, layers = 256, 512, 8, 4, 32, 2
    if big:
        hidden, inter, hd, layers = 512, 2048, 64, 4
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
           "intermediate_size": inter, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": hd, "num_hidden_layers": layers,
           "vocab_size": VOCAB, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
           "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
           "tie_word_embeddings": False}
    if hybrid:
        cfg.update(layer_types=["full_attention", "sliding_attention"] * (layers // 2),
                   sliding_window=32)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    g = torch.Generator().manual_seed(0)

    def w(*shape):
        return torch.randn(*shape, generator=g) * (1.0 / shape[-1] ** 0.5) * 2.0
    t = {"model.embed_tokens.weight": w(VOCAB, hidden), "model.norm.weight": torch.ones(hidden),
         "lm_head.weight": w(VOCAB, hidden)}
    for i in range(layers):
        p = "model.layers.%d." % i
        t.update({p + "self_attn.q_proj.weight": w(heads * hd, hidden),
                  p + "self_attn.k_proj.weight": w(kv_heads * hd, hidden),
                  p + "self_attn.v_proj.weight": w(kv_heads * hd, hidden),
                  p + "self_attn.o_proj.weight": w(hidden, heads * hd),
                  p + "mlp.gate_proj.weight": w(inter, hidden),
                  p + "mlp.up_proj.weight": w(inter, hidden),
                  p + "mlp.down_proj.weight": w(hidden, inter),
                  p + "input_layernorm.weight": torch.ones(hidden),
                  p + "post_attention_layernorm.weight": torch.ones(hidden)})
    save_file(t, os.path.join(path, "model.safetensors"))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    vocab.update({"w%d" % i: i + 4 for i in range(VOCAB - 4)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")   # joins words with spaces
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
                   "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
                   "model_max_length": 2048}, f)
    return path


def start(model, port, role, transport, mode, host_buffer, log, chunk=None):
    extra = {"transport": transport, "host_buffer": "on" if host_buffer else "auto"}
    if role == "kv_consumer":
        extra["mode"] = mode
    kvt = {"kv_connector": "HixlConnector",
           "kv_connector_module_path": "llm_datadist.vllm_connector",
           "kv_role": role, "kv_connector_extra_config": extra}
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
               OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
           "--served-model-name", "tiny", "--dtype", "float32",
           "--max-model-len", "1024", "--block-size", str(BLOCK), "--max-num-seqs", "8",
           "--enforce-eager", "--seed", "0", "--host", "127.0.0.1", "--port", str(port),
           "--enable-prompt-tokens-details", "--kv-transfer-config", json.dumps(kvt)]
    if chunk:
        cmd += ["--max-num-batched-tokens", str(chunk)]
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def wait_healthy(procs, timeout):
    deadline = time.monotonic() + timeout
    for name, (p, port) in procs.items():
        while True:
            if p.poll() is not None:
                raise RuntimeError("%s vLLM exited (%d) before it was ready" % (name, p.returncode))
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("%s vLLM not ready in %d s" % (name, timeout))
            time.sleep(0.5)


def complete(url, prompt, max_tokens):
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def control(prefill_url, decode_url, prompt, other, max_tokens, reference):
    """Prefill another prompt of the same length by hand, then ask the decode
    for prompt with that prompt's kv_transfer_params: it reads the wrong
    blocks, and its answer must differ from the reference. -> (differs, the
    prefill's KV cache groups: remote_block_ids holds one list per group)."""
    first = post(prefill_url, "/v1/completions",
                 {"model": "tiny", "prompt": other, "temperature": 0, "max_tokens": 1,
                  "kv_transfer_params": {"do_remote_decode": True}})
    out = post(decode_url, "/v1/completions",
               {"model": "tiny", "prompt": prompt, "temperature": 0, "ignore_eos": True,
                "max_tokens": max_tokens, "kv_transfer_params": first["kv_transfer_params"]})
    ids = first["kv_transfer_params"]["remote_block_ids"]
    groups = len(ids) if ids and isinstance(ids[0], list) else 1
    return out["choices"][0]["text"] != reference, groups


def stop(p):
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--transport", default="tcp", choices=["tcp", "shm"])
    ap.add_argument("--mode", default="pull", choices=["pull", "push"],
                    help="the decode reads the prefill's blocks, or has the prefill write them")
    ap.add_argument("--hybrid", action="store_true",
                    help="a model with a sliding-window layer (two KV cache groups)")
    ap.add_argument("--host-buffer", action="store_true",
                    help="both sides move a host copy of their KV cache (host_buffer \"on\")")
    ap.add_argument("--concurrent", action="store_true",
                    help="the proxy sends each request after the first to both at once and "
                         "the prefill writes each layer as it computes it")
    ap.add_argument("--big", action="store_true",
                    help="a 4-layer model of width 512, prompts prefilled in steps of 64 "
                         "tokens, the last prompt 900 tokens, each asked through the proxy "
                         "before the prefill alone (set by --concurrent)")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--ready-timeout", type=int, default=600)
    a = ap.parse_args()
    a.big = a.big or a.concurrent
    spec = importlib.util.spec_from_file_location(
        "pd_proxy", os.path.join(ROOT, "examples", "vllm", "pd_proxy.py"))
    pd_proxy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pd_proxy)

    work = tempfile.mkdtemp(prefix="hixl-vllm-e2e-")
    model = write_model(os.path.join(work, "model"), a.hybrid, a.big)
    ports = {"prefill": free_port(), "decode": free_port()}
    procs, logs = {}, {}
    t0 = time.monotonic()
    failures = []
    rows = []
    control_differs = groups = None
    try:
        for name, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            logs[name] = open(os.path.join(work, name + ".log"), "w")
            # Big: prompts prefilled in steps of 64 tokens, so that a
            # concurrent decode's ask finds steps still to come.
            procs[name] = (start(model, ports[name], role, a.transport, a.mode, a.host_buffer,
                                   logs[name], 64 if a.big else None), ports[name])
        wait_healthy(procs, a.ready_timeout)
        ready_s = time.monotonic() - t0
        prefill_url = "http://127.0.0.1:%d" % ports["prefill"]
        proxy = pd_proxy.make_server("127.0.0.1", 0, [prefill_url],
                                     ["http://127.0.0.1:%d" % ports["decode"]], timeout_s=300,
                                     concurrent=a.concurrent)
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        proxy_url = "http://127.0.0.1:%d" % proxy.server_port
        for i in range(a.requests):
            n = (40, 97, 7, 160, 33, 64)[i % 6] + i
            if a.big and i == a.requests - 1:
                n = 900     # 15 steps of 64 tokens: the decode asks while they run
            prompt = " ".join("w%d" % ((i * 37 + k * 11) % (VOCAB - 8) + 4) for k in range(n))
            if not a.big:
                ref = complete(prefill_url, prompt, a.max_tokens)
            t = time.monotonic()
            out = complete(proxy_url, prompt, a.max_tokens)
            ms = (time.monotonic() - t) * 1000
            if a.big:    # after: the prefill computes the prompt through the proxy
                ref = complete(prefill_url, prompt, a.max_tokens)
            usage = out.get("usage") or {}
            cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
            row = {"prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached,
                   "same": ref["choices"][0]["text"] == out["choices"][0]["text"],
                   "answer": out["choices"][0]["text"][:40],
                   "pd_ms": round(ms, 1)}
            rows.append(row)
            if not row["same"]:
                failures.append("prompt %d: decode answered %r, the prefill alone %r"
                                % (i, out["choices"][0]["text"], ref["choices"][0]["text"]))
            if cached < (usage.get("prompt_tokens") or 0) - BLOCK and not a.big:
                failures.append("prompt %d: the decode found %d of %d prompt tokens"
                                % (i, cached, usage.get("prompt_tokens")))
        # The control: two prompts of four blocks with the same last word.
        prompt = " ".join("w%d" % ((k * 13) % (VOCAB - 8) + 4) for k in range(4 * BLOCK))
        other = " ".join("w%d" % ((k * 29 + 5) % (VOCAB - 8) + 4) for k in range(4 * BLOCK - 1))
        other += " " + prompt.split()[-1]
        ref = complete(prefill_url, prompt, a.max_tokens)["choices"][0]["text"]
        control_differs, groups = control(prefill_url, "http://127.0.0.1:%d" % ports["decode"],
                                          prompt, other, a.max_tokens, ref)
        if not control_differs:
            failures.append("control: wrong KV gave the reference answer; the check has no teeth")
        if groups != (2 if a.hybrid else 1):
            failures.append("the prefill's KV has %d cache groups" % groups)
        proxy.shutdown()
    except Exception as e:  # noqa: BLE001
        failures.append("%s: %s" % (type(e).__name__, e))
        ready_s = None
    finally:
        for p, _ in procs.values():
            stop(p)
        for f in logs.values():
            f.close()
    overlap = None
    if (a.mode == "push" or a.concurrent) and not failures:
        # The prefill wrote (a decode that fell back to reading would pass too).
        said = "(concurrent routing; once per worker)" if a.concurrent else \
            "(push mode; once per worker)"
        with open(os.path.join(work, "prefill.log")) as f:
            log = f.read()
        if said not in log:
            failures.append("the prefill's log says no write into the decode (%s)" % said)
        # Layers let through while vLLM's forward was still running (timing:
        # reported, not required).
        overlap = "(layer by layer; once per worker)" in log
    if not failures:
        shutil.rmtree(work, ignore_errors=True)   # on failure the logs stay, named below
    print(json.dumps({"transport": a.transport, "mode": a.mode, "hybrid": a.hybrid,
                      "host_buffer": a.host_buffer, "concurrent": a.concurrent, "big": a.big,
                      "layers_overlapped": overlap,
                      "ready_s": ready_s,
                      "kv_groups": groups, "requests": rows, "control_differs": control_differs, "failures": failures,
                      "logs": work if failures else None}))
    if failures:
        for name in logs:
            sys.stderr.write("--- %s log (last 40 lines)\n" % name)
            with open(os.path.join(work, name + ".log")) as f:
                sys.stderr.writelines(f.readlines()[-40:])
        sys.exit(1)


if __name__ == "__main__":
    main()
