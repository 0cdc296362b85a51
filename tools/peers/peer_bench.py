#!/usr/bin/env python3
"""Two-process benchmarks of NIXL and Mooncake Transfer Engine on this host,
printing the JSON rows of hixl-bench so that scripts/performance.sh --peers
can put them beside hixl's (tools/peers/compare.py).

    peer_bench.py --peer nixl --path shm|tcp   NIXL's UCX backend, UCX_TLS set
                                               explicitly: posix,cma,self (shm)
                                               or tcp,self (tcp)
    peer_bench.py --peer mooncake --path tcp   Mooncake's tcp transport

Options: --op write|read|both, --blocks 4K,64K,..., --batch 1,128,...,
--threads 1,2 (requests in flight: T transfers of batch x block bytes each, on
disjoint slices, posted together and waited for together), --reps R (median),
--min-bytes (bytes moved per rep, default 256M), --max-total (skip larger),
--verify. Runs under the venv of tools/peers/setup.sh.

The target is a second process (this script with --serve) that registers a
buffer filled with a known pattern and hands its address and metadata to the
initiator over a pipe; the initiator (this process) registers its own buffer
and times the transfers. Memory on both sides: numpy arrays (malloc'd host
memory), registered with each library as it requires.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np


def parse_size(s):
    s = s.strip().upper()
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if s.endswith(suffix):
            mult, s = m, s[:-1]
    return int(s) * mult


def pattern(n, seed):
    """Byte i is (131 i + seed) mod 251: periodic, so built from one period."""
    period = ((np.arange(251, dtype=np.uint32) * 131 + seed) % 251).astype(np.uint8)
    return np.resize(period, n)


# ---------------------------------------------------------------- NIXL

def nixl_agent(name, progress_thread):
    from nixl_cu12._api import nixl_agent as Agent, nixl_agent_config
    # The initiator progresses UCX itself while it polls check_xfer_state (as
    # hixl's caller does); the target keeps NIXL's progress thread, which
    # emulated put/get over tcp needs.
    agent = Agent(name, nixl_agent_config(enable_prog_thread=progress_thread, backends=[]))
    # UCX 1.13+ refuses shared memory for endpoints with peer error handling
    # ("no peer failure handler"): "none" is what makes posix/cma usable.
    agent.create_backend("UCX", {"ucx_error_handling_mode": "none", "num_workers": "1"})
    return agent


class NixlTarget:
    def __init__(self, size):
        self.buf = pattern(size, 7)
        self.agent = nixl_agent("target-%d" % os.getpid(), True)
        self.reg = self.agent.register_memory([(self.buf.ctypes.data, size, 0, "")], "DRAM")

    def describe(self):
        return {"addr": self.buf.ctypes.data, "meta": self.agent.get_agent_metadata().hex()}


class NixlInitiator:
    def __init__(self, size, target):
        self.buf = np.zeros(size, dtype=np.uint8)
        self.agent = nixl_agent("init-%d" % os.getpid(), False)
        self.reg = self.agent.register_memory([(self.buf.ctypes.data, size, 0, "")], "DRAM")
        self.remote = self.agent.add_remote_agent(bytes.fromhex(target["meta"]))
        self.remote_addr = target["addr"]
        self.handles = []

    def prepare(self, op, block, batch, threads):
        for h in self.handles:
            self.agent.release_xfer_handle(h)
        self.handles = []
        for t in range(threads):
            base = t * block * batch
            loc = [(self.buf.ctypes.data + base + i * block, block, 0) for i in range(batch)]
            rem = [(self.remote_addr + base + i * block, block, 0) for i in range(batch)]
            self.handles.append(self.agent.initialize_xfer(
                "WRITE" if op == "write" else "READ",
                self.agent.get_xfer_descs(loc, "DRAM"), self.agent.get_xfer_descs(rem, "DRAM"),
                self.remote))

    def run_once(self):
        for h in self.handles:
            if self.agent.transfer(h) not in ("PROC", "DONE"):
                raise RuntimeError("NIXL transfer could not be posted")
        for h in self.handles:
            while True:
                s = self.agent.check_xfer_state(h)
                if s == "DONE":
                    break
                if s == "ERR":
                    raise RuntimeError("NIXL transfer failed")

    def close(self):
        for h in self.handles:
            self.agent.release_xfer_handle(h)
        self.handles = []
        self.agent.remove_remote_agent(self.remote)


# ---------------------------------------------------------------- Mooncake

def mooncake_engine():
    from mooncake.engine import TransferEngine
    e = TransferEngine()
    if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        raise RuntimeError("Mooncake TransferEngine.initialize failed")
    return e


class MooncakeTarget:
    def __init__(self, size):
        self.buf = pattern(size, 7)
        self.engine = mooncake_engine()
        if self.engine.register_memory(self.buf.ctypes.data, size) != 0:
            raise RuntimeError("Mooncake register_memory failed")

    def describe(self):
        return {"addr": self.buf.ctypes.data, "session": "127.0.0.1:%d" % self.engine.get_rpc_port()}


class MooncakeInitiator:
    def __init__(self, size, target):
        self.buf = np.zeros(size, dtype=np.uint8)
        self.engine = mooncake_engine()
        if self.engine.register_memory(self.buf.ctypes.data, size) != 0:
            raise RuntimeError("Mooncake register_memory failed")
        self.session = target["session"]
        self.remote_addr = target["addr"]

    def prepare(self, op, block, batch, threads):
        # T requests of `batch` blocks go as one batch of T x batch entries:
        # the engine moves them concurrently, as hixl's lanes would.
        n = batch * threads
        self.local = [self.buf.ctypes.data + i * block for i in range(n)]
        self.peer = [self.remote_addr + i * block for i in range(n)]
        self.lens = [block] * n
        self.fn = (self.engine.batch_transfer_sync_write if op == "write"
                   else self.engine.batch_transfer_sync_read)

    def run_once(self):
        r = self.fn(self.session, self.local, self.peer, self.lens)
        if r != 0:
            raise RuntimeError("Mooncake batch transfer failed: %r" % r)

    def close(self):
        pass


PEERS = {"nixl": (NixlTarget, NixlInitiator), "mooncake": (MooncakeTarget, MooncakeInitiator)}


def serve(args):
    target = PEERS[args.peer][0](args.region_size)
    sys.stdout.flush()
    print(json.dumps(target.describe()), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        if cmd[0] == "fill":  # fill SEED LEN: the first LEN bytes get the pattern of SEED
            n = int(cmd[2])
            target.buf[:n] = pattern(n, int(cmd[1]))
            print("ok", flush=True)
        elif cmd[0] == "check":  # check SEED LEN
            n = int(cmd[2])
            ok = bool((target.buf[:n] == pattern(n, int(cmd[1]))).all())
            print("match" if ok else "mismatch", flush=True)
    # Out without the libraries' destructors (NIXL's can crash at interpreter
    # exit); the kernel releases the memory and sockets.
    sys.stdout.flush()
    os._exit(0)


class Target:
    """The target process: started, asked, stopped by its pid."""

    def __init__(self, args):
        cmd = [sys.executable, os.path.abspath(__file__), "--serve", "--peer", args.peer,
               "--path", args.path, "--region-size", str(args.region_size)]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError("the %s target did not start" % args.peer)
        self.desc = json.loads(line)

    def ask(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def stop(self):
        try:
            self.p.stdin.write("quit\n")
            self.p.stdin.flush()
            self.p.wait(timeout=10)
        except Exception:  # noqa: BLE001 - a target that does not stop is killed
            self.p.kill()
            self.p.wait(timeout=10)


def measure(init, op, block, batch, threads, args):
    init.prepare(op, block, batch, threads)
    per = block * batch * threads
    iters = max(5, -(-args.min_bytes // per))
    init.run_once()  # warm-up: connections, first touches
    reps = []
    lat = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            s = time.perf_counter()
            init.run_once()
            lat.append(time.perf_counter() - s)
        reps.append(time.perf_counter() - t0)
    secs = statistics.median(reps)
    lat.sort()
    return iters, per * iters / secs / 1e9, secs / iters * 1e6, lat[len(lat) // 2] * 1e6, \
        lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", choices=sorted(PEERS), required=True)
    ap.add_argument("--path", choices=["shm", "tcp"], required=True)
    ap.add_argument("--op", default="both", choices=["write", "read", "both"])
    ap.add_argument("--blocks", default="4K,64K,1M,16M,128M")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--min-bytes", type=parse_size, default=parse_size("256M"))
    ap.add_argument("--max-total", type=parse_size, default=parse_size("256M"))
    ap.add_argument("--region-size", type=parse_size, default=parse_size("256M"))
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer == "mooncake" and args.path != "tcp":
        ap.error("Mooncake's non-CUDA wheel is measured over tcp only")
    if args.peer == "nixl":
        # Explicit layers, as the issue asks; inherited by the target.
        os.environ["UCX_TLS"] = "posix,cma,self" if args.path == "shm" else "tcp,self"
        os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    if args.serve:
        serve(args)
        return 0

    target = Target(args)
    rc = 0
    try:
        init = PEERS[args.peer][1](args.region_size, target.desc)
        ops = ["write", "read"] if args.op == "both" else [args.op]
        seed = 10
        for op in ops:
            for block in [parse_size(b) for b in args.blocks.split(",")]:
                for batch in [int(b) for b in args.batch.split(",")]:
                    for threads in [int(t) for t in args.threads.split(",")]:
                        total = block * batch * threads
                        if total > args.max_total or total > args.region_size:
                            continue
                        seed += 1
                        if op == "write":
                            init.buf[:total] = pattern(total, seed)
                        else:
                            target.ask("fill %d %d" % (seed, total))
                        iters, gbps, avg, p50, p99 = measure(init, op, block, batch, threads, args)
                        row = {"transport": args.path, "peer": args.peer,
                               "peer_path": ("ucx:" + os.environ["UCX_TLS"]) if args.peer == "nixl" else "tcp",
                               "mode": "bandwidth", "op": op, "block_size": block, "batch_size": batch,
                               "threads": threads, "iters": iters, "gbps": round(gbps, 4),
                               "avg_us": round(avg, 3), "p50_us": round(p50, 3), "p99_us": round(p99, 3)}
                        if args.verify:
                            if op == "write":
                                ok = target.ask("check %d %d" % (seed, total)) == "match"
                            else:
                                ok = bool((init.buf[:total] == pattern(total, seed)).all())
                            row["verified"] = ok
                            rc = rc or (0 if ok else 1)
                        print(json.dumps(row), flush=True)
    finally:
        target.stop()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # as the target: no library destructors at exit


if __name__ == "__main__":
    sys.exit(main())
