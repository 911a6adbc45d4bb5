#!/usr/bin/env python3
"""Faults of the sharded disk store through `flare run` (issue 17 part B,
design 2.14; docs/multihost.md "Fault tests").  The peers' misbehaviour
comes from FLARE_TEST_RANK_LINK (src/flare/ranks_run.c):

  - a peer killed during a write (TP4: rank 1's record service holds its
    first STORE, ranks 2 and 3 committed theirs): rank 0 unlinks the
    survivors' files, stops with a line naming rank 1 and exits 1;
  - a peer that stops reading its link (block_stores, small queue and
    socket buffers): the bounded queue fills, later stores fail at once,
    and every request still completes with one process's tokens -- rank 0's
    worker never waits on the link;
  - a job no peer completes within the job timeout stops the store and the
    instance with a clear error;
  - forged joins: a connection to the link listener with a wrong nonce, and
    one from another address than the peer's rendezvous, are refused (an
    ERROR frame back) and the real peer still joins."""
import os
import re
import socket
import struct
import sys
import time

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, TempDir, install_cleanup, wait_for  # noqa: E402
import multihost_cache as mc  # noqa: E402
from ranks import Ranks  # noqa: E402

install_cleanup()
flare = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
cores = os.path.join(src, "cores")
ARGS = ["--max-active", "1", "--prefix-cache-max-age", "off"]


def disks(tmp, tag, world):
    d = [os.path.join(tmp, f"{tag}-rank{r}") for r in range(world)]
    return d, {r: ["--prefix-cache-disk", d[r]] for r in range(world)}


def killed_in_write(tmp):
    core = os.path.join(cores, "qwen-tp4-small.core")
    d, ra = disks(tmp, "kill", 4)
    g = Ranks(flare, core, 4, args=ARGS, rank_args=ra,
              env={1: {"FLARE_TEST_RANK_LINK": "block_stores"}}).start()
    try:
        g.lead.complete(mc.PROMPT, max_tokens=4)
        wait_for(lambda: all(mc.rank_files(d[r]) for r in (2, 3)), "ranks 2 and 3 to commit")
        assert not mc.rank_files(d[1])
        g.peers[0].kill()
        wait_for(lambda: g.lead.proc.poll() is not None, "rank 0 to stop")
        rc = g.lead.stop(check=False)
        tail = g.lead.stderr_tail()
        assert rc == 1 and "the instance stops" in tail and "rank 1" in tail, (rc, tail)
        left = {r: mc.rank_files(d[r]) for r in (2, 3)}
        assert not any(left.values()), f"the survivors kept the partial store: {left}"
        for p in g.peers[1:]:
            assert p.wait(20) == 1, p.tail()
        line = [ln for ln in tail.splitlines() if "stops" in ln][0]
        print(f"a peer killed during a write: ranks 2 and 3 committed, rank 0 unlinked theirs "
              f"and stopped: {line}")
    finally:
        g.kill_all()


def stalled_peer(tmp):
    core = os.path.join(cores, "qwen-tp2-small.core")
    prompts = [f"request {i}: the ranks keep their own records, " * 60 for i in range(100)]
    with Flare(flare, core=core, name="one process") as one:
        want = [one.complete(p, max_tokens=2)["choices"][0]["text"] for p in prompts[:4]]
    d, ra = disks(tmp, "stall", 2)
    # The links' TCP user timeout (30 s) would end the stalled link as a
    # vanished host's, and the job timeout (60 s) the held store, before a
    # sanitizer build fills the queue: 5 minutes each.
    env = {0: {"FLARE_TEST_RANK_LINK":
               "queue_jobs=2,sock_buf=1024,user_timeout_ms=300000,job_timeout_ms=300000"},
           1: {"FLARE_TEST_RANK_LINK": "block_stores,sock_buf=1024,user_timeout_ms=300000"}}
    # A GPU cache whose copy-out pin bound (a quarter of its pages) holds
    # more stores than the link's socket buffers and queue.
    g = Ranks(flare, core, 2, args=ARGS + ["--gpu-cache", "1GiB"], rank_args=ra, env=env).start()
    try:
        worst, got = 0.0, []
        for i, p in enumerate(prompts):
            t = time.monotonic()
            got.append(g.lead.complete(p, max_tokens=2)["choices"][0]["text"])
            worst = max(worst, time.monotonic() - t)
            m = g.lead.metrics()
            if m.get("flare_host_cache_store_failures_total") >= 4:
                break
        assert got[:4] == want, (got[:4], want)
        fails = m.get("flare_host_cache_store_failures_total")
        assert fails >= 4, "no store failed with a peer that stopped reading: " + "\n".join(ln for ln in m.text.splitlines() if "host_cache" in ln and not ln.startswith("#"))
        print(f"a peer that stops reading: after {i + 1} requests {fails:.0f} stores failed at "
              f"once (the queue was full); every request completed (slowest {worst * 1000:.0f} "
              f"ms) with one process's tokens")
    finally:
        g.kill_all()


def job_timeout(tmp):
    core = os.path.join(cores, "qwen-tp2-small.core")
    d, ra = disks(tmp, "timeout", 2)
    env = {0: {"FLARE_TEST_RANK_LINK": "job_timeout_ms=1500"},
           1: {"FLARE_TEST_RANK_LINK": "block_stores"}}
    g = Ranks(flare, core, 2, args=ARGS, rank_args=ra, env=env).start()
    try:
        g.lead.complete(mc.PROMPT, max_tokens=4)
        wait_for(lambda: g.lead.proc.poll() is not None, "rank 0 to stop")
        rc = g.lead.stop(check=False)
        tail = g.lead.stderr_tail()
        assert rc == 1 and "the host prefix cache stopped" in tail, (rc, tail)
        print("a job no peer completes in time stops the instance:",
              [ln for ln in tail.splitlines() if "stops" in ln][0])
    finally:
        g.kill_all()


def join_frame(nonce, world=2, rank=1):
    p = struct.pack("<IIII", 0x44524853, 2, world, rank) + nonce + bytes(32) + bytes(16)
    p += b"\x01" + bytes(7) + struct.pack("<Q", 1 << 30)
    return struct.pack("<IHH", len(p), 2, 0) + p


def forge(port, src_addr):
    s = socket.create_connection(("127.0.0.1", port), timeout=10,
                                 source_address=(src_addr, 0))
    try:
        s.sendall(join_frame(os.urandom(16)))
        h = s.recv(8)
        ln, typ, _ = struct.unpack("<IHH", h)
        body = b""
        while len(body) < ln:
            c = s.recv(ln - len(body))
            if not c:
                break
            body += c
        n = struct.unpack("<I", body[4:8])[0] if len(body) >= 8 else 0
        return typ, body[8:8 + n].decode(errors="replace")  # ERROR: status, text
    finally:
        s.close()


def forged_joins(tmp):
    """While the real peer's link waits (join_delay_ms), two forgers connect
    to rank 0's link listener; the forgers run on a thread, rank 0 on this
    one (its processes die with the thread that started them)."""
    core = os.path.join(cores, "qwen-tp2-small.core")
    d, ra = disks(tmp, "forge", 2)
    g = Ranks(flare, core, 2, args=ARGS, rank_args=ra,
              env={1: {"FLARE_TEST_RANK_LINK": "join_delay_ms=3000"}})
    out = {}

    def forgers():
        try:
            wait_for(lambda: g.lead is not None and
                     re.search(r"listen on port (\d+)", g.lead.stderr_tail(40)) is not None,
                     "the link port")
            port = int(re.search(r"listen on port (\d+)", g.lead.stderr_tail(40)).group(1))
            out["nonce"] = forge(port, "127.0.0.1")
            out["address"] = forge(port, "127.0.0.2")
        except BaseException as e:  # reported below
            out["error"] = e

    import threading
    t = threading.Thread(target=forgers, daemon=True)
    t.start()
    try:
        g.start()
        t.join(30)
        assert "error" not in out, out.get("error")
        typ, text = out["nonce"]
        assert typ == 4 and "nonce" in text, (typ, text)
        print("a join with a wrong nonce is refused:", text)
        typ, text = out["address"]
        assert typ == 4 and ("address" in text or "nonce" in text), (typ, text)
        print("a join from another address (127.0.0.2) is refused:", text)
        text, fl = mc.ask(g.lead)
        g.lead.settle()
        ls = mc.wait_same(d, "after the forgeries")
        g.stop()
        print(f"and the real peer joined: the instance served and stored ({len(ls)} files on "
              f"each rank)")
    finally:
        g.kill_all()


with TempDir("flare-ranks-faults-") as tmp:
    killed_in_write(tmp)
    stalled_peer(tmp)
    job_timeout(tmp)
    forged_joins(tmp)
print("ok")
