#!/usr/bin/env python3
"""kill -9 of an instance during an export (issue 15 fault acceptance,
design 2.15 "Faults"), with real `flare run` processes and `flare pool`.

  1. A (warm memory + pool) computes a prompt. The manager is restarted on
     its kept arena file: the catalogue starts empty, A reattaches and
     announces its GPU holdings again, so A's GPU cache is the only source
     of the prompt (the neighbour source; the arena has no record of it).
  2. A is stopped (SIGSTOP) and B (pool only) asks for the prompt: the
     manager asks A for an export and holds the export's arena windows for
     it. Once the manager counts the request, A is killed (SIGKILL) while
     that export is open.
  3. B answers correctly (recomputed: source none, the tokens of a run
     without offload) and keeps serving; the manager refuses B's claim
     `gone`, quarantines A's leases and reclaims them once A's process is
     gone (no lease, no window left: the arena's used bytes are its
     records'), drops A's holdings and stays healthy (/health, lookups and
     puts from B); a later request from B restores the prompt from the
     pool (B's own put) with the same tokens.
Every wait is by condition with a deadline; processes are stopped by pid."""
import os
import re
import signal
import sys
import threading
import time
import urllib.request

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, Metrics, TempDir, install_cleanup, start_pool, wait_for  # noqa: E402

install_cleanup()
binary = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")


class Manager:
    """`flare pool` on a kept arena file, its metrics on a free port."""

    def __init__(self, sock, arena):
        self.sock, self.arena, self.log, self.proc, self.port = sock, arena, sock + ".log", None, 0

    def start(self):
        # A progress timeout far beyond the test: the export lease must still
        # be open (not failed for no progress) when A is killed.
        self.proc = start_pool(binary, self.sock, [
            "--memory", "32MiB", "--arena", self.arena, "--metrics-port", "0",
            "--recovery-timeout", "5s", "--progress-timeout", "60s"])
        self.port = self.proc.port
        return self

    def get(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.port, path), timeout=10) as r:
            return r.status, r.read().decode()

    def metrics(self):
        return Metrics(self.get("/metrics")[1])

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(20)
            assert rc == 0, "flare pool exited %d: %s" % (rc, open(self.log).read())
        self.proc = None


def ask(f, text, max_tokens=12):
    r = f.chat([{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0)
    return r["choices"][0]["message"]["content"], r["flare"]


def client_state(f):
    m = f.metrics()
    for s in ("attached", "detached", "disabled", "off"):
        if m.get("flare_pool_client_state", state=s) == 1:
            return s
    return "?"


def settled(f):
    m = f.metrics()
    return (m.get("flare_host_cache_copyout_pins") == 0 and
            m.get("flare_pool_puts_total") == m.get("flare_pool_puts_accepted_total") +
            m.get("flare_pool_puts_refused_total") + m.get("flare_pool_puts_failed_total"))


PROMPT = ("Tell me about the lighthouse keepers of the northern islands, their lamps, their logs, "
          "the storms of winter and the ships that passed their rocks at night.")
PROMPT2 = "And a short note on the birds that nest on those rocks in spring, please."

with TempDir("flare-pool-xk-") as tmpdir:
    mgr = Manager(os.path.join(tmpdir, "p.sock"), os.path.join(tmpdir, "arena")).start()
    pool = ["--prefix-cache-pool", "unix:" + mgr.sock, "--prefix-cache-fetch", "always",
            "--prefix-cache-pool-grace", "2s"]
    a = b = None
    try:
        with Flare(binary, [], name="R") as r:
            want, _ = ask(r, PROMPT)
            want2, _ = ask(r, PROMPT2)
        a = Flare(binary, ["--prefix-cache-memory", "8MiB"] + pool, name="A").start()
        got, fl = ask(a, PROMPT)
        assert got == want and fl["source"] == "none", (got, want, fl)
        wait_for(lambda: settled(a), "A's puts to settle")

        # 1. A restarted manager on the kept arena: no records, A back with
        # its GPU holdings (announced again after the reattach).
        mgr.stop()
        wait_for(lambda: client_state(a) == "detached", "A to notice the manager's stop")
        mgr.start()
        wait_for(lambda: client_state(a) == "attached", "A to reattach")

        def only_a():
            m = mgr.metrics()
            return (m.get("flare_pool_recovering") == 0 and m.get("flare_pool_records") == 0 and
                    m.get("flare_pool_holdings") >= 1)
        wait_for(only_a, "A's holdings in an empty catalogue")
        b = Flare(binary, pool, name="B").start()
        assert "no local tier" in b.summary(), b.summary()
        before = mgr.metrics()

        # 2. A frozen; B's request makes the manager ask A for an export.
        os.kill(a.proc.pid, signal.SIGSTOP)
        answer = {}

        def b_asks():
            try:
                answer["r"] = ask(b, PROMPT)
            except Exception as e:  # reported by the main thread
                answer["e"] = e
        t = threading.Thread(target=b_asks, daemon=True)
        t.start()
        wait_for(lambda: mgr.metrics().delta(before, "flare_pool_exports_requested_total") >= 1,
                 "the manager to ask A for an export")
        m = mgr.metrics()
        assert m.get("flare_pool_leases") >= 1, m.text  # the export's lease, windows held
        assert m.get("flare_pool_exports_served_total") == before.get(
            "flare_pool_exports_served_total"), m.text
        a.kill()  # SIGKILL while the export is open (and reaped: /proc/PID goes)
        a = None

        # 3. B recomputes, right answer.
        t.join(60)
        assert not t.is_alive(), "B's request did not end"
        assert "e" not in answer, answer.get("e")
        got, fl = answer["r"]
        print("B while A died:", fl)
        assert got == want and fl["source"] == "none", (got, want, fl)
        bm = b.metrics()
        assert bm.get("flare_pool_claims_failed_total", reason="gone") == 1, bm.text
        assert bm.get("flare_pool_restores_total") == 0, bm.text

        # The manager: the claim refused gone, A's lease quarantined and
        # reclaimed, A's holdings gone (what is left is B's), no window left over.
        def reclaimed():
            m = mgr.metrics()
            bm = b.metrics()
            b_holds = (bm.get("flare_pool_holdings_announced_total") -
                       bm.get("flare_pool_holdings_withdrawn_total"))
            return (m.get("flare_pool_leases") == 0 and m.get("flare_pool_quarantined_leases") == 0
                    and m.get("flare_pool_holdings") == b_holds and m.get("flare_pool_sessions") == 1)
        wait_for(reclaimed, "the manager to reclaim A's leases", show=lambda: "\n".join(
            ln for ln in mgr.get("/metrics")[1].splitlines()
            if re.match(r"flare_pool_(leases|quarantined|holdings|sessions|exports)", ln)))
        m = mgr.metrics()
        assert m.delta(before, "flare_pool_exports_refused_total", reason="gone") == 1, m.text
        assert m.delta(before, "flare_pool_claims_refused_total", reason="gone") == 1, m.text
        assert m.delta(before, "flare_pool_leases_quarantined_total") >= 1, m.text
        assert m.delta(before, "flare_pool_leases_reclaimed_total") >= 1, m.text
        assert m.get("flare_pool_quarantined_bytes") == 0, m.text
        assert mgr.get("/health")[0] == 200
        assert mgr.proc.poll() is None

        # B keeps serving; its copy of the prompt went to the pool.
        wait_for(lambda: settled(b), "B's puts to settle")

        def only_records():  # /metrics is the manager's snapshot of its last tick
            m = mgr.metrics()
            return (m.get("flare_pool_records") >= 1 and m.get("flare_pool_leases") == 0 and
                    m.get("flare_pool_arena_used_bytes") == m.get("flare_pool_record_bytes"))
        wait_for(only_records, "the arena to hold B's records and nothing else")
        got, fl = ask(b, PROMPT2)
        assert got == want2 and fl["source"] == "none", (got, want2, fl)
        assert client_state(b) == "attached"
        # A later request for the prompt, from a restarted B (its GPU cache
        # empty): restored from the pool (B's own put), the same tokens.
        b.stop()
        b = Flare(binary, pool, name="B2").start()
        got, fl = ask(b, PROMPT)
        print("B after a restart:", fl)
        assert got == want and fl["source"] == "pool", (got, want, fl)
        b.stop()
        b = None
    finally:
        for f in (a, b):
            if f:
                f.kill()
        mgr.stop()
print("ok")
