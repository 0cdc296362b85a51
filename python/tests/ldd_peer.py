"""The second process of test_llm_datadist.py. It runs what the test sends,
one JSON object per stdin line, in one namespace that holds llm_datadist (as
ldd), numpy (as np) and the helpers below:

  {"exec": "<statements>"}   -> {"ok": null}
  {"eval": "<expression>"}   -> {"ok": <the value, JSON-encoded>}

A failure answers {"err": "<message>", "code": <LLMException status code or
null>, "type": "<exception class>"}. One answer line per request; the process
exits on EOF (or when the test kills it)."""
import base64
import hashlib
import json
import sys
import threading
import time
import traceback

import numpy as np

import llm_datadist as ldd


def pattern(n, seed):
    """n pseudo-random bytes (the tests compute the same on their side)."""
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def b64(arrays):
    """The bytes of each array (base64), so the test can compare every byte."""
    return [base64.b64encode(np.ascontiguousarray(a).tobytes()).decode() for a in arrays]


def sha(obj):
    return hashlib.sha256(memoryview(obj).cast("B")).hexdigest()


def port_of(dd):
    return int(dd.local_address.rpartition(":")[2])


def event_dict(e):
    return {"kind": e.kind.name, "peer_cluster_id": e.peer_cluster_id, "cache_id": e.cache_id,
            "key": None if e.key is None else [e.key.prompt_cluster_id, e.key.req_id,
                                                e.key.model_id],
            "blocks": list(e.blocks), "batch_index": e.batch_index,
            "layer_range": None if e.layer_range is None else [e.layer_range.start,
                                                               e.layer_range.stop],
            "user_tag": e.user_tag}


def wait_events(cm, n, timeout=5.0):
    """At least n events (as dicts) from cm.get_transfer_events, polled up to timeout s."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        got += [event_dict(e) for e in cm.get_transfer_events()]
        time.sleep(0.002)
    return got


def wait_until(pred, timeout=5.0):
    """Polls pred() until it is true or timeout s passed; returns its last value."""
    deadline = time.monotonic() + timeout
    v = pred()
    while not v and time.monotonic() < deadline:
        time.sleep(0.002)
        v = pred()
    return v


def main():
    ns = {"ldd": ldd, "np": np, "pattern": pattern, "b64": b64, "sha": sha, "port_of": port_of,
          "event_dict": event_dict, "wait_events": wait_events, "wait_until": wait_until, "threading": threading, "time": time}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        req = json.loads(line)
        try:
            if "exec" in req:
                exec(req["exec"], ns)
                out = {"ok": None}
            else:
                out = {"ok": eval(req["eval"], ns)}
        except ldd.LLMException as e:
            out = {"err": str(e), "code": int(e.status_code), "type": "LLMException"}
        except Exception as e:  # noqa: BLE001 - reported to the test
            out = {"err": "%s: %s\n%s" % (type(e).__name__, e, traceback.format_exc()),
                   "code": None, "type": type(e).__name__}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
