"""One SGLang prefill or decode rank, driven line by line from a test.

It publishes SGLang's runtime context for its rank, builds the KV and metadata
buffers a scheduler would hand SGLang's KVArgs, and makes the manager, senders
and receivers SGLang's get_kv_class returns for --backend (hixl, loaded
through SGLang's plugin entry points, or SGLang's own fake backend). It calls
them from one thread, as SGLang's scheduler does, and polls every live request
between commands, recording each change of state.

The KV content is a function of (buffer, page, token, head): every rank can say
what any page must hold, so a decode checks the bytes it received, head slice
by head slice under different TP sizes, and that nothing else changed.

Prints "READY <engine address>" and then one JSON line per command:
  sender ROOM | init ROOM NPAGES AUX | send ROOM PAGES | receiver ROOM
  meta ROOM PAGES AUX | wait ROOM STATE SECONDS | states ROOM | abort ROOM
  failure ROOM | clear ROOM | check SRC_PAGES DST_PAGES SRC_AUX DST_AUX
  drained ROOM ACKS SECONDS | zero (every buffer) | untouched (every buffer still zero) | quit
PAGES: comma-separated page indices ("-" for none). `wait` answers with the
time a poll first saw the state and (prefill) the time of the first send.
"""
import argparse
import json
import os
import select
import sys
import time

import numpy as np

NAMES = {0: "Failed", 1: "Bootstrapping", 2: "WaitingForInput", 3: "Transferring", 4: "Success"}
AUX_ROW_BYTES = (32, 8)


def full_kv(buf, pages, page_size, heads, head_bytes):
    """The whole model's KV of buffer `buf`: [pages, page_size, heads, head_bytes]."""
    rng = np.random.default_rng(1000 + buf)
    return rng.integers(0, 256, (pages, page_size, heads, head_bytes), dtype=np.uint8)


def full_aux(i, rows):
    return np.random.default_rng(5000 + i).integers(0, 256, (rows, AUX_ROW_BYTES[i]),
                                                     dtype=np.uint8)


def pages_arg(s):
    return np.array([] if s == "-" else [int(x) for x in s.split(",")], dtype=np.int32)


class Node:
    def __init__(self, o):
        self.o = o
        from sglang.srt.plugins import load_plugins
        load_plugins()
        from sglang.srt.disaggregation.utils import (DisaggregationMode, KVClassType,
                                                     TransferBackend, get_kv_class)
        from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish
        from sglang.srt.server_args import ServerArgs
        sa = ServerArgs(model_path="dummy", disaggregation_mode=o.role,
                        disaggregation_transfer_backend=o.backend,
                        disaggregation_bootstrap_port=o.bootstrap_port, host="127.0.0.1",
                        tp_size=o.tp)
        publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=o.rank))
        get_parallel().override_permanently(pp_group=None)
        tb = TransferBackend(o.backend)
        self.cls = {k.value: get_kv_class(tb, k) for k in KVClassType}
        self.server = None
        if o.serve:
            self.server = self.cls["bootstrap_server"]("127.0.0.1", o.bootstrap_port)
        self.heads = 1 if o.mla else o.heads // o.tp          # this rank's heads
        self.bufs = o.layers if o.mla else 2 * o.layers
        self.kv = []
        for b in range(self.bufs):
            if o.role == "prefill" and o.fast:
                self.kv.append(np.full((o.pages, o.page_size, self.heads, o.head_bytes), b + 1,
                                       dtype=np.uint8))
            elif o.role == "prefill":
                f = full_kv(b, o.pages, o.page_size, 1 if o.mla else o.heads, o.head_bytes)
                lo = 0 if o.mla else o.rank * self.heads
                self.kv.append(np.ascontiguousarray(f[:, :, lo:lo + self.heads, :]))
            else:
                self.kv.append(np.zeros((o.pages, o.page_size, self.heads, o.head_bytes),
                                        dtype=np.uint8))
        rows = o.aux_rows
        self.aux = [full_aux(i, rows) if o.role == "prefill" else
                    np.zeros((rows, AUX_ROW_BYTES[i]), dtype=np.uint8) for i in range(2)]
        a = self.cls["kvargs"]()
        a.engine_rank = o.rank
        a.kv_data_ptrs = [x.ctypes.data for x in self.kv]
        a.kv_data_lens = [x.nbytes for x in self.kv]
        a.kv_item_lens = [x[0].nbytes for x in self.kv]
        a.kv_layer_ids = list(range(o.layers))
        a.aux_data_ptrs = [x.ctypes.data for x in self.aux]
        a.aux_data_lens = [x.nbytes for x in self.aux]
        a.aux_item_lens = [x[0].nbytes for x in self.aux]
        for f in ("state_data_ptrs", "state_data_lens", "state_item_lens", "state_types",
                  "state_layer_ids", "state_dim_per_tensor", "state_slice_outer_counts"):
            setattr(a, f, [])
        a.page_size, a.kv_cache_dtype_str, a.kv_layout = o.page_size, "auto", None
        a.swa_kv_cache_layout = "nhd"
        a.ib_device, a.gpu_id, a.pp_rank, a.system_dp_rank = None, 0, 0, 0
        a.prefill_start_layer, a.prefill_end_layer, a.rust_http_port = 0, None, None
        if not o.mla:
            a.kv_head_num, a.total_kv_head_num = self.heads, o.heads
        self.mode = DisaggregationMode(o.role)
        self.mgr = self.cls["manager"](a, self.mode, sa, o.mla)
        self.addr = "127.0.0.1:%d" % o.bootstrap_port
        self.reqs = {}      # room -> sender or receiver
        self.seen = {}      # room -> [state names as polled]
        self.when = {}      # (room, state) -> when a poll first saw it
        self.sent = {}      # room -> when its first chunk was sent

    def poll_all(self):
        for room, r in list(self.reqs.items()):
            try:
                s = NAMES[int(r.poll())]
            except Exception as e:  # noqa: BLE001
                s = "poll raised %s" % e
            seq = self.seen[room]
            if not seq or seq[-1] != s:
                seq.append(s)
                self.when.setdefault((room, s), time.time())

    def cmd(self, words):
        c, args = words[0], words[1:]
        room = int(args[0]) if args and c != "check" else None
        if c == "sender":
            self.reqs[room] = self.cls["sender"](self.mgr, self.addr, room)
            self.seen[room] = []
        elif c == "receiver":
            self.reqs[room] = self.cls["receiver"](self.mgr, self.addr, room)
            self.seen[room] = []
            self.poll_all()     # the scheduler polls before the receiver's init
            if hasattr(self.mgr, "try_ensure_parallel_info"):
                deadline = time.time() + 20
                while not self.mgr.try_ensure_parallel_info(self.addr):
                    if time.time() > deadline:
                        return {"error": "no parallel info from %s" % self.addr}
                    time.sleep(0.05)
            self.reqs[room].init(0)
        elif c == "init":
            self.reqs[room].init(int(args[1]), int(args[2]))
        elif c == "send":
            self.sent.setdefault(room, time.time())
            self.reqs[room].send(pages_arg(args[1]))
        elif c == "meta":
            self.reqs[room].send_metadata(pages_arg(args[1]), int(args[2]))
        elif c == "wait":
            want, deadline = args[1], time.time() + float(args[2])
            while time.time() < deadline:
                self.poll_all()
                if self.seen[room] and self.seen[room][-1] in (want, "Failed"):
                    break
                time.sleep(0.0002)
            return {"state": self.seen[room][-1] if self.seen[room] else None,
                    "states": self.seen[room], "t": self.when.get((room, want)),
                    "sent": self.sent.get(room)}
        elif c == "states":
            self.poll_all()
            return {"states": self.seen[room]}
        elif c == "abort":
            self.reqs[room].abort()
        elif c == "failure":
            try:
                self.reqs[room].failure_exception()
            except Exception as e:  # noqa: BLE001 -- its text is the answer
                return {"exception": type(e).__name__, "message": str(e)}
            return {"error": "failure_exception did not raise"}
        elif c == "clear":
            self.reqs.pop(room).clear()
        elif c == "drained":    # every prefill rank answered this rank's ABORT
            deadline = time.time() + float(args[2])
            while not self.mgr.is_abort_release_safe(room, int(args[1])):
                if time.time() > deadline:
                    return {"drained": False}
                self.poll_all()
                time.sleep(0.005)
            return {"drained": True}
        elif c == "zero":
            for b in self.kv + self.aux:
                b[...] = 0
        elif c == "untouched":
            return {"untouched": not any(b.any() for b in self.kv + self.aux)}
        elif c == "check":
            return self.check(pages_arg(args[0]), pages_arg(args[1]), int(args[2]),
                              int(args[3]))
        elif c == "quit":
            return {"bye": True}
        else:
            return {"error": "unknown command %r" % c}
        return {"ok": True}

    def check(self, src, dst, src_aux, dst_aux):
        """The decode's pages `dst` hold what pages `src` hold in the model's KV
        (this rank's heads); every other page and metadata row is untouched."""
        o = self.o
        lo = 0 if o.mla else o.rank * self.heads
        want_pages = set(int(x) for x in dst)
        for b, buf in enumerate(self.kv):
            f = full_kv(b, o.pages, o.page_size, 1 if o.mla else o.heads, o.head_bytes)
            for s, d in zip(src, dst):
                if not np.array_equal(buf[d], f[s, :, lo:lo + self.heads, :]):
                    return {"ok": False, "bad": "buffer %d page %d (from %d)" % (b, d, s)}
            for p in range(o.pages):
                if p not in want_pages and buf[p].any():
                    return {"ok": False, "bad": "buffer %d page %d was written" % (b, p)}
        for i, a in enumerate(self.aux):
            if not np.array_equal(a[dst_aux], full_aux(i, o.aux_rows)[src_aux]):
                return {"ok": False, "bad": "metadata buffer %d row %d" % (i, dst_aux)}
            others = np.delete(a, dst_aux, axis=0)
            if others.any():
                return {"ok": False, "bad": "metadata buffer %d: another row was written" % i}
        return {"ok": True}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--role", choices=("prefill", "decode"), required=True)
    p.add_argument("--backend", default="hixl")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--bootstrap-port", type=int, required=True)
    p.add_argument("--serve", action="store_true", help="run the bootstrap server here")
    p.add_argument("--mla", action="store_true")
    p.add_argument("--pages", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--page-size", type=int, default=4)
    p.add_argument("--head-bytes", type=int, default=16)
    p.add_argument("--aux-rows", type=int, default=8)
    p.add_argument("--fast", action="store_true",
                   help="KV content from a cheap pattern (benchmarks: no page checks)")
    o = p.parse_args()
    node = Node(o)
    print("READY %s" % getattr(node.mgr, "engine_address", "-"), flush=True)
    buf = b""
    while True:
        node.poll_all()
        r, _, _ = select.select([sys.stdin], [], [], 0.002)
        if not r:
            continue
        chunk = os.read(sys.stdin.fileno(), 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            words = line.decode().split()
            if not words:
                continue
            try:
                out = node.cmd(words)
            except Exception as e:  # noqa: BLE001 -- the test reads it
                out = {"error": "%s: %s" % (type(e).__name__, e)}
            print(json.dumps(out), flush=True)
            if words[0] == "quit":
                os._exit(0)   # SGLang's threads are not daemons everywhere


if __name__ == "__main__":
    main()
