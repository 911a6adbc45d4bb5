#!/usr/bin/env python3
"""A neighbour's host tiers in `flare run` (issue 15, design 2.15 copy
priority "neighbour GPU, host DRAM, host NVMe, pool"): one `flare pool`
manager and `flare run` instances with the tiny core on loopback.

  1. A (disk + pool) computes a prompt, which lands in its disk tier, and
     stops; restarted on the same directory its GPU cache is empty, and it
     announces the recovered records as NVMe holdings. B (pool only)
     answers the prompt with source "neighbour_disk" (A read its record
     file, every header, page and row checked, into arena windows) and the
     tokens of a run without offload.
  2. C (memory + pool, a small GPU cache) computes another prompt and then
     enough others to evict it from its GPU cache; its memory tier keeps
     it. B answers it with source "neighbour_memory" and the no-offload
     tokens.
Every wait is by condition with a deadline; processes are stopped by pid."""
import os
import signal
import sys

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, Metrics, TempDir, install_cleanup, start_pool, wait_for  # noqa: E402
import urllib.request  # noqa: E402

install_cleanup()
binary = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")


def start_manager(sock):
    return start_pool(binary, sock, ["--memory", "32MiB", "--metrics-port", "0"])


def ask(f, text, max_tokens=12):
    r = f.chat([{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0)
    return r["choices"][0]["message"]["content"], r["flare"]


def held(mgr):
    """The holdings the manager has in its catalogue."""
    url = "http://127.0.0.1:%d/metrics" % mgr.port
    with urllib.request.urlopen(url, timeout=10) as r:
        return Metrics(r.read().decode()).get("flare_pool_holdings")


def sent(*fs):
    """The holdings these instances announced and did not withdraw."""
    n = 0
    for f in fs:
        m = f.metrics()
        n += m.get("flare_pool_holdings_announced_total") - m.get(
            "flare_pool_holdings_withdrawn_total")
        for t in ("memory", "disk"):
            n += m.get("flare_pool_host_holdings_announced_total", tier=t) - m.get(
                "flare_pool_host_holdings_withdrawn_total", tier=t)
    return n


def announced(f, tier):
    return f.metrics().get("flare_pool_host_holdings_announced_total", tier=tier)


PROMPT = ("Tell me a long story about the tides of the northern sea and the moon, the sailors, the "
          "fishermen and their boats, the harbours and the lighthouses along the rocky coast.")
PROMPT2 = ("A second question, about the winds over the southern ocean and the albatross that "
           "follows the ships for days, and the old maps of the currents, please.")

with TempDir("flare-pool-host-") as tmpdir:
    sock, disk = os.path.join(tmpdir, "p.sock"), os.path.join(tmpdir, "disk")
    os.mkdir(disk)
    mgr = start_manager(sock)
    pool = ["--prefix-cache-pool", "unix:" + sock, "--prefix-cache-fetch", "always",
            "--prefix-cache-pool-grace", "2s"]
    try:
        with Flare(binary, [], name="R") as r:
            want, _ = ask(r, PROMPT)
            want2, _ = ask(r, PROMPT2)
        adisk = ["--prefix-cache-disk", disk, "--prefix-cache-disk-limit", "64MiB"]
        with Flare(binary, adisk + pool, name="A") as a:
            got, fl = ask(a, PROMPT)
            assert got == want and fl["source"] == "none", (got, fl)
            wait_for(lambda: announced(a, "disk") >= 1, "A's disk records announced")
        a = Flare(binary, adisk + pool, name="A2").start()
        wait_for(lambda: announced(a, "disk") >= 1, "A2's recovered records announced")
        b = Flare(binary, pool, name="B").start()
        wait_for(lambda: held(mgr) == sent(a) > 0, "the manager to have A2's holdings")
        got, fl = ask(b, PROMPT)
        print("B from A's disk:", fl)
        assert got == want and fl["source"] == "neighbour_disk", (got, want, fl)
        m = b.metrics()
        assert m.get("flare_pool_reused_tokens_total", source="neighbour_disk") > 0, m.text
        assert m.get("flare_pool_reused_tokens_total", source="neighbour") == 0, m.text
        wait_for(lambda: a.metrics().get("flare_pool_exports_served_total") >= 1,
                 "A2's export in its metrics")
        a.stop()

        # 320 KiB of GPU cache: about 19 pages, so other prompts evict PROMPT2's.
        c = Flare(binary, ["--prefix-cache-memory", "8MiB", "--gpu-cache", "320KiB"] + pool,
                  name="C").start()
        got, fl = ask(c, PROMPT2)
        assert got == want2, (got, want2)
        wait_for(lambda: announced(c, "memory") >= 1, "C's memory records announced")
        for i in range(20):
            if c.metrics().get("flare_pool_holdings_withdrawn_total") >= 1:
                break
            ask(c, "Another question, number %d, about the harbours and the lighthouses." % i)
        m = c.metrics()
        assert m.get("flare_pool_holdings_withdrawn_total") >= 1, m.text
        # The manager has seen C's withdrawals (and B's own GPU holdings).
        wait_for(lambda: held(mgr) == sent(b, c), "the manager to follow C's holdings")
        got, fl = ask(b, PROMPT2)
        assert got == want2, (got, want2, fl)
        print("B from C's memory:", fl)
        assert fl["source"] == "neighbour_memory", fl
        for f in (b, c):
            f.stop()
    finally:
        mgr.send_signal(signal.SIGTERM)
        mgr.wait(20)
print("ok")
