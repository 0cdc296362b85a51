"""A second process for the pytest tests. Roles:
  context  -- Context(0, 1): allocates buffer "kv", fills it, serves until
              stdin closes; on "CHECK <offset> <n> <seed>" verifies bytes.
  engine   -- hixl.Hixl listening: alloc_mem, fill, prints "<engine> <addr> <size>".
              Commands:
                CHECK <n> <seed>        the first n bytes hold pattern(n, seed)
                GEN                     prints its generation
                NOTIFIES                prints get_notifies() as JSON
                WAITNOTIFY <name> <n> <seed> <timeout_s>
                                        polls get_notifies until <name> arrives, then
                                        checks the memory at once: "OK <msg hex>"
                CBCHECK <n> <seed>      sets a notify callback that checks the memory
                                        the moment each notification arrives
                CBGET <count> <timeout_s>
                                        waits for <count> callback calls, prints JSON
                SEND <remote> <name> <msg>
                                        connects (once) and sends a notification
Prints one line per command; exits on EOF."""
import json
import sys
import threading
import time

import numpy as np

import hixl


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def main():
    role = sys.argv[1]
    size = int(sys.argv[2])
    if role == "context":
        with hixl.Context(device_id=0, peer_device_id=1) as ctx:
            buf = ctx.allocate(size, flags=hixl.MEM_ZERO_COPY, name="kv")
            src = pattern(size, 1)
            ctx.write(src, buf, size)  # one-sided write into the shared buffer
            print("READY", ctx.engine, flush=True)
            for line in sys.stdin:
                parts = line.split()
                if parts[0] == "CHECK":
                    off, n, seed = int(parts[1]), int(parts[2]), int(parts[3])
                    got = np.empty(n, dtype=np.uint8)
                    ctx.read(buf, got, n, offset=off)
                    print("OK" if np.array_equal(got, pattern(n, seed)) else "MISMATCH", flush=True)
    elif role == "engine":
        h = hixl.Hixl()
        h.initialize("127.0.0.1:0")
        addr = h.alloc_mem(size)
        hixl._hixl.memmove(addr, pattern(size, 2), size)
        print(h.local_engine(), addr, size, flush=True)

        def holds(n, seed):
            got = np.empty(n, dtype=np.uint8)
            hixl._hixl.memmove(got, addr, n)
            return bool(np.array_equal(got, pattern(n, seed)))

        calls = []
        calls_cv = threading.Condition()
        connected = set()
        for line in sys.stdin:
            parts = line.split()
            if parts[0] == "CHECK":
                print("OK" if holds(int(parts[1]), int(parts[2])) else "MISMATCH", flush=True)
            elif parts[0] == "GEN":
                print(h.generation(), flush=True)
            elif parts[0] == "NOTIFIES":
                print(json.dumps([[d.name, d.msg.hex(), d.sender] for d in h.get_notifies()]), flush=True)
            elif parts[0] == "WAITNOTIFY":
                name, n, seed, timeout = parts[1], int(parts[2]), int(parts[3]), float(parts[4])
                deadline = time.monotonic() + timeout
                answer = "TIMEOUT"
                while time.monotonic() < deadline and answer == "TIMEOUT":
                    for d in h.get_notifies():
                        if d.name == name:
                            answer = ("OK " + d.msg.hex()) if holds(n, seed) else "MISMATCH"
                    time.sleep(0.0005)
                print(answer, flush=True)
            elif parts[0] == "CBCHECK":
                n, seed = int(parts[1]), int(parts[2])

                def cb(d, n=n, seed=seed):
                    ok = holds(n, seed)
                    with calls_cv:
                        calls.append([d.name, d.msg.hex(), d.sender, ok])
                        calls_cv.notify_all()
                h.set_notify_callback(cb)
                print("SET", flush=True)
            elif parts[0] == "CBGET":
                count, timeout = int(parts[1]), float(parts[2])
                with calls_cv:
                    calls_cv.wait_for(lambda: len(calls) >= count, timeout)
                    print(json.dumps(calls), flush=True)
                    del calls[:]
            elif parts[0] == "SEND":
                remote, name, msg = parts[1], parts[2], parts[3]
                try:
                    if remote not in connected:
                        h.connect(remote, timeout_ms=5000)
                        connected.add(remote)
                    h.send_notify(remote, name, msg.encode())
                    print("SENT", flush=True)
                except hixl.HixlError as e:
                    print("ERR", e.code_name, flush=True)
        h.finalize()


if __name__ == "__main__":
    main()
