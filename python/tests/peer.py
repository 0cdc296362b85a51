"""A second process for the pytest tests. Roles:
  context  -- Context(0, 1): allocates buffer "kv", fills it, serves until
              stdin closes; on "CHECK <offset> <n> <seed>" verifies bytes.
  engine   -- hixl.Hixl listening: alloc_mem, fill, prints "<engine> <addr> <size>".
Prints one line per command; exits on EOF."""
import sys

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
        for line in sys.stdin:
            parts = line.split()
            if parts[0] == "CHECK":
                n, seed = int(parts[1]), int(parts[2])
                got = np.empty(n, dtype=np.uint8)
                hixl._hixl.memmove(got, addr, n)
                print("OK" if np.array_equal(got, pattern(n, seed)) else "MISMATCH", flush=True)
        h.finalize()


if __name__ == "__main__":
    main()
