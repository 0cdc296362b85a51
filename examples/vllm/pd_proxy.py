#!/usr/bin/env python3
"""A minimal prefill/decode proxy for vLLM instances running HixlConnector
(docs/VLLM.md). Standard library only.

    python3 examples/vllm/pd_proxy.py --port 8000 \
        --prefill http://10.0.0.1:8100 --decode http://10.0.0.2:8200

Each POST to /v1/completions or /v1/chat/completions goes first to the
prefill instance with kv_transfer_params {"do_remote_decode": true},
max_tokens 1 and no streaming; the kv_transfer_params of its answer go with
the client's original request to the decode instance, whose answer (streamed
or not) goes back to the client. Other paths are refused (404). Several
prefill or decode URLs are used in turn.

With --concurrent (decode and prefill instances of HixlConnector), a
request goes to both at once once the proxy has seen one answer of that
prefill instance (its "hixl" entry names the prefill's workers): the
prefill gets {"do_remote_decode": true, "hixl_xid": N}, the decode the
entry with transfer id N, and the prefill writes each layer into the
decode's blocks as it computes it. The first request to each prefill goes
the sequential way. Should the prefill fail, the decode computes the
prompt itself once it is refused or the prefill's lease_ms has passed."""
import argparse
import http.server
import itertools
import json
import secrets
import sys
import threading
import urllib.error
import urllib.request

PATHS = ("/v1/completions", "/v1/chat/completions")
MAX_BODY = 64 << 20


class Backends:
    def __init__(self, prefill, decode):
        self._p, self._d = itertools.cycle(prefill), itertools.cycle(decode)
        self._lock = threading.Lock()

    def next(self):
        with self._lock:
            return next(self._p), next(self._d)


def concurrent_params(answer_params, xid):
    """The decode's kv_transfer_params for a request sent to both instances
    at once: a prefill answer's kv_transfer_params (from an earlier
    request) with the proxy's transfer id xid."""
    h = {k: v for k, v in answer_params["hixl"].items() if k != "expires_at"}
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [],
            "remote_engine_id": answer_params.get("remote_engine_id"),
            "remote_request_id": "proxy-%x" % xid,
            "remote_host": answer_params.get("remote_host"),
            "remote_port": answer_params.get("remote_port"),
            "hixl": dict(h, xid=xid, concurrent=True)}


def post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    return urllib.request.urlopen(req, timeout=timeout)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    backends = None
    timeout_s = 600
    concurrent = False
    known = None              # prefill URL -> kv_transfer_params of its last answer
    known_lock = threading.Lock()

    def _fail(self, code, msg):
        data = json.dumps({"error": {"message": msg, "code": code}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):  # noqa: N802 (http.server's name)
        if self.path not in PATHS:
            return self._fail(404, "only %s are proxied" % ", ".join(PATHS))
        try:
            n = int(self.headers.get("Content-Length", "-1"))
        except ValueError:
            n = -1
        if n < 0 or n > MAX_BODY:
            return self._fail(411 if n < 0 else 413, "a JSON body with Content-Length is needed")
        try:
            body = json.loads(self.rfile.read(n))
        except ValueError as e:
            return self._fail(400, "the body is not JSON: %s" % e)
        if not isinstance(body, dict):
            return self._fail(400, "the body must be a JSON object")
        prefill, decode = self.backends.next()
        with self.known_lock:
            entry = self.known.get(prefill) if self.concurrent else None

        # 1. Prefill: one token, keep the KV for a decode to read.
        first = dict(body, kv_transfer_params={"do_remote_decode": True}, max_tokens=1,
                     stream=False)
        first.pop("stream_options", None)
        if "max_completion_tokens" in first:
            first["max_completion_tokens"] = 1
        if entry is not None:
            # Concurrent: both at once, the prefill writing as it computes.
            xid = secrets.randbits(62) or 1
            first["kv_transfer_params"] = {"do_remote_decode": True, "hixl_xid": xid}
            params = concurrent_params(entry, xid)
            side = threading.Thread(target=self._prefill, args=(prefill, first), daemon=True)
            side.start()
        else:
            side = None
            params, err = self._prefill(prefill, first)
            if err:
                return self._fail(502, err)

        # 2. Decode: the client's request, with the prefill's parameters.
        try:
            r = post(decode + self.path, dict(body, kv_transfer_params=params), self.timeout_s)
        except urllib.error.HTTPError as e:
            data = e.read()
            self.send_response(e.code)
            self.send_header("Content-Type", e.headers.get("Content-Type", "application/json"))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        except (urllib.error.URLError, OSError) as e:
            return self._fail(502, "decode %s: %s" % (decode, e))
        with r:
            self.send_response(r.status)
            self.send_header("Content-Type", r.headers.get("Content-Type", "application/json"))
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                chunk = r.read1(65536) if hasattr(r, "read1") else r.read(65536)
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        if side is not None:
            side.join(self.timeout_s)

    def _prefill(self, url, body):
        """-> (the answer's kv_transfer_params, None) or (None, what failed)."""
        try:
            with post(url + self.path, body, self.timeout_s) as r:
                answer = json.loads(r.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.log_message("prefill %s: %s", url, e)
            return None, "prefill %s: %s" % (url, e)
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not params or not isinstance(params.get("hixl"), dict):
            return None, ("prefill %s answered without kv_transfer_params (is it running "
                          "HixlConnector as kv_producer?)" % url)
        if self.concurrent:
            with self.known_lock:
                self.known[url] = params
        return params, None

    def log_message(self, fmt, *args):
        sys.stderr.write("pd_proxy: %s\n" % (fmt % args))


def make_server(host, port, prefill, decode, timeout_s=600, concurrent=False):
    """The proxy's server (not started): serve_forever() to run it."""
    handler = type("ProxyHandler", (Handler,), {"backends": Backends(prefill, decode),
                                                "timeout_s": timeout_s,
                                                "concurrent": concurrent, "known": {},
                                                "known_lock": threading.Lock()})
    return http.server.ThreadingHTTPServer((host, port), handler)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", action="append", required=True, help="a prefill URL (repeat)")
    ap.add_argument("--decode", action="append", required=True, help="a decode URL (repeat)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per backend request")
    ap.add_argument("--concurrent", action="store_true",
                    help="send each request to prefill and decode at once (HixlConnector's "
                         "layer-wise writes; after one answer of each prefill)")
    a = ap.parse_args(argv)
    for u in a.prefill + a.decode:
        if not u.startswith(("http://", "https://")):
            ap.error("%r is not an http(s) URL" % u)
    srv = make_server(a.host, a.port, [u.rstrip("/") for u in a.prefill],
                      [u.rstrip("/") for u in a.decode], a.timeout, a.concurrent)
    print("pd_proxy: listening on http://%s:%d" % srv.server_address[:2], flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
