#!/usr/bin/env python3
"""The remote tier with TP > 1 cores and over the pool (issue 16 part B
gaps), against a real redis-server on loopback.

  1. TP2: two `flare run` "hosts" (one process each, both ranks' caches in
     it, separate disk directories) share a prefix through a standalone
     server.  deepseek-tp2-small's MLA pages and rows are the same on both
     ranks, so its records are packed (design 2.5: stored once); qwen-tp2-
     small's are not.  B restores from "remote" with the tokens of a run
     without offload.
  2. Remote over pooled: one `flare pool` manager and two instances on
     "host 1" (pool and remote), one instance on "host 2" (remote only, a
     disk directory of its own).  Host 2 restores host 1's prefix from
     "remote"; host 1's second instance from "pool" or "neighbour"; tokens
     as without offload.
Exit 77 without redis-server."""
import json
import os
import signal
import subprocess
import sys
import time

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flare import Flare, TempDir, die_with_parent, install_cleanup  # noqa: E402
from remote_fixture import BIN, Redis, ask, wait_for, written  # noqa: E402

install_cleanup()
ALWAYS = ["--prefix-cache-fetch", "always"]
TURN2 = "And what of the spring tides, then, and of the neap tides between them?"
PROMPT = "Tell me about the tides of the northern sea, and the moon that pulls them, at length."


def tp2(tmp, r, name, packed):
    """A and B, one TP2 process each, with disk tiers of their own.  A's
    records go to Redis as its disk store lays them out: packed where the
    ranks' pages and rows are the same (no more bytes on Redis than in A's
    record files), per rank otherwise.  B restores turn 1 from Redis, then
    turn 2 over its GPU-resident turn 1 (a claim that starts inside a
    chain of two records)."""
    core = os.path.join(src, "cores", name + ".core")
    url = f"redis://127.0.0.1:{r.port}"
    with Flare(BIN, [], core=core, name=name + "-base") as f:
        want = ask(f, PROMPT)[0]
        turn2 = PROMPT + want + " " + TURN2
        want2 = ask(f, turn2)[0]
    hosts = [ALWAYS + ["--prefix-cache-disk", os.path.join(tmp, name, h),
                       "--prefix-cache-remote", url] for h in ("a", "b")]
    with Flare(BIN, hosts[0], core=core, name=name + "-A") as a:
        for p, w in ((PROMPT, want), (turn2, want2)):
            text, fl = ask(a, p)
            assert text == w and fl["source"] in ("none", "gpu"), (text, w, fl)
        out = written(a, 2).get("flare_remote_bytes_out_total")
    ls = json.loads(subprocess.run([BIN, "records", "ls", os.path.join(tmp, name, "a"), "--json"],
                                   capture_output=True, text=True, timeout=60).stdout)
    recs = [rec for ns in ls["namespaces"] for rec in ns["records"]]
    disk = sum(rec["bytes"] for rec in recs)
    assert len(recs) >= 2 and all((not rec["tail_pages"] or rec["replicated_pages"] == packed) and
                                  (not rec["row"] or rec["replicated_row"] == packed)
                                  for rec in recs), recs
    # Redis holds window payload (and a row for every record, where the disk
    # may keep some page-only); A's files add headers and padding.  Packed
    # records written per rank would be about twice A's files.
    assert 0 < out <= 1.2 * disk, (out, disk)
    with Flare(BIN, hosts[1], core=core, name=name + "-B") as b:
        text, fl = ask(b, PROMPT)
        assert fl["source"] == "remote" and fl["reused_host_tokens"] > 0, fl
        assert text == want, (text, want)
        text, fl = ask(b, turn2)
        assert fl["source"] == "remote" and fl["reused_gpu_tokens"] > 0 and \
            fl["reused_host_tokens"] > 0, fl
        assert text == want2, (text, want2)
        m = b.metrics()
        inb = m.get("flare_remote_bytes_in_total")
        assert m.get("flare_remote_hits_total") >= 2 and inb > 0, m.text[-2000:]
        assert m.get("flare_remote_corrupt_total") == 0
    print(f"{name}: B restored both turns from remote ({fl['reused_gpu_tokens']} tokens on "
          f"its GPU, {fl['reused_host_tokens']} from Redis); {'packed' if packed else 'per-rank'} "
          f"records: {out:.0f} bytes written to Redis, {disk} in A's record files, "
          f"{inb:.0f} read by B")


def start_manager(sock, arena):
    log = open(sock + ".log", "w")
    p = subprocess.Popen([BIN, "pool", "--socket", sock, "--memory", "32MiB", "--arena", arena],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         preexec_fn=die_with_parent)
    try:
        wait_for("flare pool to listen", lambda: p.poll() is None and
                 "listening on unix:" in open(sock + ".log").read() or p.poll() is not None)
        assert p.poll() is None, "flare pool exited: " + open(sock + ".log").read()
    except BaseException:
        p.kill()
        p.wait(10)
        raise
    return p


def pool_settled(f):
    m = f.metrics()
    return (m.get("flare_host_cache_copyout_pins") == 0 and
            m.get("flare_pool_puts_total") == m.get("flare_pool_puts_accepted_total") +
            m.get("flare_pool_puts_refused_total") + m.get("flare_pool_puts_failed_total"))


def over_pool(tmp, r):
    url = f"redis://127.0.0.1:{r.port}"
    with Flare(BIN, [], name="base") as f:
        want = ask(f, PROMPT)[0]
    sock, arena = os.path.join(tmp, "p.sock"), os.path.join(tmp, "arena")
    mgr = start_manager(sock, arena)
    remote = ["--prefix-cache-remote", url]
    pool = ["--prefix-cache-pool", "unix:" + sock, "--prefix-cache-pool-grace", "2s"]
    try:
        with Flare(BIN, ALWAYS + ["--prefix-cache-memory", "8MiB"] + pool + remote,
                   name="host1-A") as a, \
             Flare(BIN, ALWAYS + pool + remote, name="host1-B") as b, \
             Flare(BIN, ALWAYS + ["--prefix-cache-disk", os.path.join(tmp, "host2")] + remote,
                   name="host2") as c:
            for f in (a, b):
                assert "shared through unix:" + sock in f.summary() and \
                    "remote tier " + url in f.summary(), f.summary()
            text, fl = ask(a, PROMPT)
            assert text == want and fl["source"] == "none", (text, want, fl)
            written(a, 1)
            wait_for("host 1's pool puts", lambda: pool_settled(a))
            text, fl = ask(c, PROMPT)
            assert fl["source"] == "remote" and fl["reused_host_tokens"] > 0, fl
            assert text == want, (text, want)
            print("host 2 restored host 1's prefix from remote:", fl)
            text, fl = ask(b, PROMPT)
            assert fl["source"] in ("pool", "neighbour") and fl["reused_host_tokens"] > 0, fl
            assert text == want, (text, want)
            assert b.metrics().get("flare_remote_hits_total") == 0
            print("host 1's second instance restored from", fl["source"], fl)
    finally:
        mgr.send_signal(signal.SIGTERM)
        try:
            mgr.wait(20)
        except subprocess.TimeoutExpired:
            mgr.kill()
            mgr.wait(10)


with TempDir("test_remote_tp-", os.environ.get("TEST_TMPDIR")) as tmp:
    r = Redis(tmp, "redis").start()
    try:
        tp2(tmp, r, "deepseek-tp2-small", packed=True)
        tp2(tmp, r, "qwen-tp2-small", packed=False)
        over_pool(tmp, r)
    finally:
        r.stop()
print("ok")
