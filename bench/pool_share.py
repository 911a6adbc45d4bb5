#!/usr/bin/env python3
"""bench/pool_share.py - host memory for N `flare run` instances sharing one
long prefix through `flare pool` (issue 15: "one copy in the pool, not N").

One manager and N pool-only instances (no local tier) of the tiny core
with its context raised to 16K tokens (a copy of cores/tiny.core).
Instance 1 computes a PROMPT_TOKENS-token prompt; instances 2..N answer it
restoring from the pool.  Compared in the same run with what N instances
with their own warm memory tier would hold: each its own copy of the
records instance 1 stored (their bytes in slot layout, measured in the
arena after instance 1 alone).

    RESULT pool_share_arena_record_bytes <bytes in the arena's records> bytes
    RESULT pool_share_local_bytes <N x instance 1's record bytes> bytes
    RESULT pool_share_ratio <arena / local> ratio   (goal: 1/N)
    RESULT pool_share_restored <instances that restored from the pool> instances

Usage: bench/pool_share.py [--flare build/flare] [-n 4] [--tokens 10000]
"""
import argparse
import os
import re
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "qualify"))
from flare import Flare, TempDir, die_with_parent, install_cleanup  # noqa: E402


def manager_metrics(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(flare_pool_[a-z_]+) (\S+)$", line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def wait_for(pred, what, timeout=60):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            sys.exit("timed out waiting for " + what)
        time.sleep(0.02)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flare", default=os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare"))
    ap.add_argument("-n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=10000)
    a = ap.parse_args()
    install_cleanup()
    words = "the tides of the northern sea turn under the moon; "
    prompt = (words * (a.tokens // len(words) + 1))[:a.tokens - 16]
    with TempDir("flare-pool-bench-") as tmp:
        sock, log = os.path.join(tmp, "p.sock"), os.path.join(tmp, "mgr.log")
        with open(log, "w") as lf:
            mgr = subprocess.Popen([a.flare, "pool", "--socket", sock, "--memory", "512MiB",
                                    "--metrics-port", "0"], stdout=lf, stderr=lf,
                                   preexec_fn=die_with_parent)
        try:
            wait_for(lambda: "listening on unix:" in open(log).read(), "flare pool")
            port = int(re.search(r"metrics on http://[^:]+:(\d+)", open(log).read()).group(1))
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            core = os.path.join(tmp, "tiny16k.core")
            with open(os.path.join(root, "cores", "tiny.core")) as f:
                text = re.sub(r"(?m)^max_context = \d+$", "max_context = 16384", f.read())
            with open(core, "w") as f:
                f.write(text)
            args = ["--prefix-cache-pool", "unix:" + sock, "--prefix-cache-fetch", "always",
                    "--prefix-cache-pool-grace", "1s",
                    "--gpu-cache", "256MiB"]
            inst = [Flare(a.flare, args, core=core, name=f"i{i}").start() for i in range(a.n)]
            try:
                msgs = [{"role": "user", "content": prompt}]
                r = inst[0].chat(msgs, max_tokens=4)
                assert r["flare"]["source"] == "none", r["flare"]

                def settled(f):
                    m = f.metrics()
                    return m.get("flare_host_cache_copyout_pins") == 0 and \
                        m.get("flare_pool_puts_total") == m.get("flare_pool_puts_accepted_total") + \
                        m.get("flare_pool_puts_refused_total") + m.get("flare_pool_puts_failed_total")
                wait_for(lambda: settled(inst[0]), "instance 1's puts")
                # One copy of instance 1's records, as the arena holds them
                # (slot layout, as a local memory tier would hold them too).
                one = manager_metrics(port)["flare_pool_record_bytes"]
                restored = 0
                for f in inst[1:]:
                    r = f.chat(msgs, max_tokens=4)
                    restored += r["flare"]["source"] == "pool"
                    wait_for(lambda: settled(f), f.name + "'s puts")
                for f in inst:
                    m = f.metrics()
                    print(f"# {f.name}: puts {m.get('flare_pool_puts_total'):.0f}, accepted "
                          f"{m.get('flare_pool_puts_accepted_total'):.0f}, bytes "
                          f"{m.get('flare_pool_put_bytes_total'):.0f}")
                mm = manager_metrics(port)
                print(f"# manager: records {mm.get('flare_pool_records', 0):.0f}, committed "
                      f"{mm.get('flare_pool_bytes_put_total', 0):.0f} bytes")
                arena = mm["flare_pool_record_bytes"]
                local = a.n * one
                print(f"RESULT pool_share_arena_record_bytes {arena:.0f} bytes")
                print(f"RESULT pool_share_local_bytes {local:.0f} bytes")
                print(f"RESULT pool_share_ratio {arena / local:.3f} ratio (goal {1 / a.n:.3f}: "
                      f"one copy for {a.n} instances)")
                print(f"RESULT pool_share_restored {restored} instances (of {a.n - 1})")
            finally:
                for f in inst:
                    f.stop(check=False)
        finally:
            mgr.terminate()
            mgr.wait(20)


if __name__ == "__main__":
    main()
