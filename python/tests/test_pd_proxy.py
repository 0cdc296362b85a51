"""examples/vllm/pd_proxy.py between two stand-in vLLM OpenAI servers on
loopback: what each receives, what the client gets back, and the errors."""
import http.server
import importlib.util
import json
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "pd_proxy", os.path.join(HERE, "..", "..", "examples", "vllm", "pd_proxy.py"))
pd_proxy = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pd_proxy)

PARAMS = {"do_remote_prefill": True, "remote_block_ids": [1, 2], "hixl": {"v": 1}}


class Stub(http.server.BaseHTTPRequestHandler):
    """A stand-in vLLM: records each body; the prefill answers with
    kv_transfer_params (unless told not to), the decode with text, streamed
    in three chunks when asked to."""
    protocol_version = "HTTP/1.1"

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append((self.path, body))
        if self.server.role == "prefill":
            ans = {"choices": [{"text": "x"}]}
            if not self.server.no_params:
                ans["kv_transfer_params"] = PARAMS
            data = json.dumps(ans).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        elif body.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"data: a\n\n", b"data: b\n\n", b"data: [DONE]\n\n"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        else:
            data = json.dumps({"choices": [{"text": "decoded"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    def log_message(self, *a):
        pass


def serve(srv):
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    return t


@pytest.fixture
def world():
    servers = []
    for role in ("prefill", "decode"):
        s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
        s.role, s.seen, s.no_params = role, [], False
        serve(s)
        servers.append(s)
    p, d = servers
    proxy = pd_proxy.make_server("127.0.0.1", 0, ["http://127.0.0.1:%d" % p.server_port],
                                 ["http://127.0.0.1:%d" % d.server_port], timeout_s=10)
    serve(proxy)
    yield p, d, "http://127.0.0.1:%d" % proxy.server_port
    for s in (proxy, p, d):
        s.shutdown()
        s.server_close()


def call(url, body, raw=None):
    data = raw if raw is not None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def test_a_request_goes_prefill_then_decode_with_the_prefills_params(world):
    p, d, url = world
    body = {"model": "m", "prompt": "hello", "max_tokens": 20, "temperature": 0}
    status, out = call(url + "/v1/completions", body)
    assert status == 200 and json.loads(out)["choices"][0]["text"] == "decoded"
    (path, first), = p.seen
    assert path == "/v1/completions"
    assert first["kv_transfer_params"] == {"do_remote_decode": True}
    assert first["max_tokens"] == 1 and first["stream"] is False and first["prompt"] == "hello"
    (path, second), = d.seen
    assert second == dict(body, kv_transfer_params=PARAMS)


def test_streaming_answers_are_relayed(world):
    p, d, url = world
    status, out = call(url + "/v1/chat/completions",
                       {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                        "stream": True, "stream_options": {"include_usage": True},
                        "max_completion_tokens": 9})
    assert status == 200 and out == b"data: a\n\ndata: b\n\ndata: [DONE]\n\n"
    first = p.seen[0][1]
    assert first["stream"] is False and "stream_options" not in first
    assert first["max_completion_tokens"] == 1
    assert d.seen[0][1]["stream"] is True and d.seen[0][1]["max_completion_tokens"] == 9


def test_errors_are_clear(world):
    p, d, url = world
    with pytest.raises(urllib.error.HTTPError) as e:
        call(url + "/v1/embeddings", {})
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError) as e:
        call(url + "/v1/completions", None, raw=b"{not json")
    assert e.value.code == 400
    p.no_params = True
    with pytest.raises(urllib.error.HTTPError) as e:
        call(url + "/v1/completions", {"prompt": "x"})
    assert e.value.code == 502 and b"without kv_transfer_params" in e.value.read()
    assert d.seen == []   # nothing reached the decode


def test_an_unreachable_decode_is_a_502(world):
    p, d, _ = world
    proxy = pd_proxy.make_server("127.0.0.1", 0, ["http://127.0.0.1:%d" % p.server_port],
                                 ["http://127.0.0.1:1"], timeout_s=5)
    serve(proxy)
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            call("http://127.0.0.1:%d/v1/completions" % proxy.server_port, {"prompt": "x"})
        assert e.value.code == 502
    finally:
        proxy.shutdown()
        proxy.server_close()


def test_concurrent_routing_sends_to_both_once_the_prefill_answered(world):
    """--concurrent: the first request goes prefill then decode; later ones
    go to both at once, the prefill with the proxy's transfer id and the
    decode with the prefill's entry carrying the same id."""
    p, d, _ = world
    proxy = pd_proxy.make_server("127.0.0.1", 0, ["http://127.0.0.1:%d" % p.server_port],
                                 ["http://127.0.0.1:%d" % d.server_port], timeout_s=10,
                                 concurrent=True)
    serve(proxy)
    try:
        url = "http://127.0.0.1:%d/v1/completions" % proxy.server_port
        for _ in range(3):
            assert call(url, {"prompt": "x", "max_tokens": 4})[0] == 200
        # The client's answer may come before the prefill's (both at once).
        for _ in range(500):
            if len(p.seen) == 3:
                break
            time.sleep(0.01)
        assert p.seen[0][1]["kv_transfer_params"] == {"do_remote_decode": True}
        assert d.seen[0][1]["kv_transfer_params"] == PARAMS
        to_prefill = sorted(b["kv_transfer_params"]["hixl_xid"] for _, b in p.seen[1:])
        to_decode = []
        for _, b in d.seen[1:]:
            kd = b["kv_transfer_params"]
            assert kd["do_remote_prefill"] is True and kd["remote_block_ids"] == []
            assert set(kd["hixl"]) == {"v", "xid", "concurrent"} and kd["hixl"]["concurrent"]
            to_decode.append(kd["hixl"]["xid"])
        assert len(p.seen) == len(d.seen) == 3
        assert sorted(to_decode) == to_prefill and len(set(to_prefill)) == 2
        assert all(0 < x < 2**62 for x in to_prefill)
    finally:
        proxy.shutdown()
        proxy.server_close()
