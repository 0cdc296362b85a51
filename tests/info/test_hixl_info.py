#!/usr/bin/env python3
"""hixl-info against real processes (the CTest test tools_hixl_info):

    test_hixl_info.py HIXL_INFO TEST_PEER ETCD

- the host report (text and --json): version, build, every transport with a
  usable flag and a reason, UCX layers when built with UCX;
- --engine ADDR against a hixl_test_peer with registered regions: its
  generation, the link, region count and bytes, no addresses; with the
  peer's AuthSecretFile the link authenticates and the addresses are listed;
- --etcd URL against a real etcd with a named peer: listed alive; once the
  peer is killed, listed gone; --engine NAME resolves through etcd;
- bad arguments and unreachable engines: exit 1 with one line on stderr.
Every process is stopped by its pid; every wait is bounded.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

INFO, PEER, ETCD = sys.argv[1:4]
FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAILED:", what, flush=True)


def run_info(*args, timeout=60):
    p = subprocess.run([INFO, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """A hixl_test_peer: one command per line, one answer per line."""

    def __init__(self, *opts):
        args = [PEER]
        for o in opts:
            args += ["--opt", o]
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline().split()
        if not line or line[0] != "READY":
            self.stop()
            raise RuntimeError("peer did not start: %r" % line)
        self.engine = line[1]

    def send(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)


def host_report():
    rc, out, err = run_info()
    check(rc == 0, "hixl-info exits 0 (got %d: %s)" % (rc, err))
    check(out.startswith("hixl "), "the text report starts with the version: %r" % out[:40])
    for t in ("shm", "tcp"):
        check("  %s " % t in out, "the text report names transport %s" % t)
    rc, out, err = run_info("--json")
    check(rc == 0, "hixl-info --json exits 0 (%s)" % err)
    r = json.loads(out)
    check(r["version"] and r["build"], "version and build are given: %r" % r)
    names = {t["name"]: t for t in r["transports"]}
    check(names.get("tcp", {}).get("usable") is True, "tcp is usable: %r" % names)
    check(names.get("shm", {}).get("usable") is True, "shm is usable: %r" % names)
    for t in r["transports"]:
        check(t["usable"] or t["detail"], "an unusable transport says why: %r" % t)
    if "ucx=on" in r["build"]:
        check("ucx" in names, "a UCX build lists ucx")
        tls = {l["tl"] for l in r["ucx_layers"]}
        check("tcp" in tls or "posix" in tls, "UCX's layers are listed: %r" % tls)
    else:
        check("ucx_layers_note" in r, "a build without UCX says so")
    print("host report: %s; transports %s" %
          (r["build"], ", ".join("%s=%s" % (n, t["usable"]) for n, t in names.items())))


def engine_report(tmp):
    peer = Peer()
    try:
        check(peer.send("reg a 1048576 rw").startswith("OK"), "peer registers a")
        check(peer.send("reg b 65536 r").startswith("OK"), "peer registers b")
        gen = int(peer.send("gen").split()[1])
        rc, out, err = run_info("--engine", peer.engine, "--json")
        check(rc == 0, "--engine exits 0 (%s)" % err)
        r = json.loads(out)
        check(r["generation"] == gen, "the engine's generation: %r vs %d" % (r["generation"], gen))
        check(r["regions"]["count"] == 2, "two regions: %r" % r["regions"])
        check(r["regions"]["bytes"] == 1048576 + 65536, "their bytes: %r" % r["regions"])
        check("list" not in r["regions"], "no addresses on an unauthenticated link")
        check(r["link"]["authenticated"] is False, "not authenticated")
        check(r["link"]["transport"] in ("SHM", "shm"), "a same-host link is shm: %r" % r["link"])
        rc, out, err = run_info("--engine", peer.engine)
        check(rc == 0 and "regions: 2" in out, "text engine report: %r %s" % (out, err))
    finally:
        peer.stop()
    secret = os.path.join(tmp, "secret")
    with open(secret, "w") as f:
        f.write("0123456789abcdef0123456789abcdef\n")
    os.chmod(secret, 0o600)
    peer = Peer("AuthSecretFile=" + secret)
    try:
        addr = int(peer.send("reg a 4096 rw").split()[1])
        rc, out, err = run_info("--engine", peer.engine, "--auth-secret-file", secret, "--json")
        check(rc == 0, "--engine with the secret exits 0 (%s)" % err)
        r = json.loads(out)
        check(r["link"]["authenticated"] is True, "authenticated: %r" % r["link"])
        lst = r["regions"].get("list", [])
        check([x["addr"] for x in lst] == [addr], "the address is listed: %r vs %d" % (lst, addr))
        check(lst and lst[0]["perms"] == "rw", "with its permissions: %r" % lst)
    finally:
        peer.stop()
    # Nothing listens there.
    rc, out, err = run_info("--engine", "127.0.0.1:%d" % free_port(), "--timeout-ms", "2000")
    check(rc == 1 and len(err.strip().splitlines()) == 1 and "refuses" in err,
          "an address nobody listens at: one clear line (%d, %r)" % (rc, err))


def etcd_report(tmp):
    cport, pport = free_port(), free_port()
    url = "http://127.0.0.1:%d" % cport
    etcd = subprocess.Popen(
        [ETCD, "--data-dir", os.path.join(tmp, "etcd"), "--listen-client-urls", url,
         "--advertise-client-urls", url, "--listen-peer-urls", "http://127.0.0.1:%d" % pport,
         "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % pport,
         "--initial-cluster", "default=http://127.0.0.1:%d" % pport],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peer = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("etcd did not come up")
                time.sleep(0.1)
        ep = "etcd://127.0.0.1:%d" % cport
        peer = Peer("MetadataServer=" + ep, "EngineName=info-peer", "MetadataTtlS=30")
        rc, out, err = run_info("--etcd", ep, "--json")
        check(rc == 0, "--etcd exits 0 (%s)" % err)
        r = json.loads(out)
        rows = {x["name"]: x for x in r["engines"]}
        check(rows.get("info-peer", {}).get("state") == "alive", "the peer is alive: %r" % rows)
        check(rows.get("info-peer", {}).get("address") == peer.engine, "at its address")
        rc, out, err = run_info("--engine", "info-peer", "--etcd", ep, "--json")
        check(rc == 0 and json.loads(out)["address"] == peer.engine,
              "--engine NAME resolves through etcd (%s)" % err)
        peer.stop()
        rc, out, err = run_info("--etcd", ep)
        check(rc == 0 and "info-peer" in out and "gone" in out,
              "a killed engine is listed gone until its lease expires: %r" % out)
    finally:
        if peer is not None:
            peer.stop()
        etcd.send_signal(signal.SIGTERM)
        try:
            etcd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            etcd.kill()
            etcd.wait(timeout=10)


def bad_arguments():
    for args in (["--bogus"], ["--engine"], ["--timeout-ms", "0"], ["--auth-secret-file", "x"]):
        rc, out, err = run_info(*args)
        check(rc == 1 and len(err.strip().splitlines()) == 1 and err.startswith("hixl-info: "),
              "%s: exit 1 and one line (%d, %r)" % (args, rc, err))
    rc, out, err = run_info("--help")
    check(rc == 0 and "--engine" in out, "--help")


def main():
    tmp = tempfile.mkdtemp(prefix="hixl-info-test-")
    try:
        host_report()
        engine_report(tmp)
        if ETCD != "none":
            etcd_report(tmp)
        else:
            print("no etcd in this build: --etcd not checked")
        bad_arguments()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print("%d checks failed" % len(FAILURES))
        return 1
    print("hixl-info: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
