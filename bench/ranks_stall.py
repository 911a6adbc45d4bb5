#!/usr/bin/env python3
"""bench/ranks_stall.py - rank 0's decode latency while a peer stops reading
its record link (issue 17 part B; design 2.14: "a peer that stops reading
fills a bounded queue and fails the job instead of stalling the worker").

qwen-tp2-small as two `flare run` processes, each rank with its own record
directory.  A publisher thread sends distinct long prompts (each publishes
a checkpoint the sharded store writes on both ranks) while the measuring
thread streams short-prompt completions and records the gaps between
tokens at rank 0's HTTP interface.  Two runs with the same flags and link
knobs (queue_jobs=2, 1 KiB socket buffers): the baseline, where rank 1
serves its record link, and the stall, where rank 1's record service
blocks in its first store (FLARE_TEST_RANK_LINK=block_stores) so its link
queue fills and later stores fail at once.  The stall is measured only
after the first store failed (the queue is full) and ends before the
link's 30 s TCP user timeout.

    RESULT ranks_stall_baseline_p50 <ms> ms     RESULT ranks_stall_p50 <ms> ms
    RESULT ranks_stall_baseline_p99 <ms> ms     RESULT ranks_stall_p99 <ms> ms
    RESULT ranks_stall_p50_ratio <stall / baseline> ratio   (goal: 1 within noise)
    RESULT ranks_stall_p99_ratio <stall / baseline> ratio
    RESULT ranks_stall_store_failures <stores refused during the stall> stores

Usage: bench/ranks_stall.py [--flare build/flare] [--seconds 8]
"""
import argparse
import os
import sys
import threading
import time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(root, "qualify"))
from flare import TempDir, find_flare, install_cleanup  # noqa: E402
from ranks import Ranks  # noqa: E402

CORE = os.path.join(root, "cores", "qwen-tp2-small.core")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def run(flare, tmp, tag, stall, seconds):
    dirs = {r: ["--prefix-cache-disk", os.path.join(tmp, f"{tag}{r}")] for r in (0, 1)}
    env = {0: {"FLARE_TEST_RANK_LINK": "queue_jobs=2,sock_buf=1024"},
           1: {"FLARE_TEST_RANK_LINK": ("block_stores," if stall else "") + "sock_buf=1024"}}
    args = ["--max-active", "2", "--gpu-cache", "1GiB", "--prefix-cache-max-age", "off"]
    g = Ranks(flare, CORE, 2, args=args, rank_args=dirs, env=env).start()
    stop = threading.Event()
    sent = [0]

    def publisher():
        i = 0
        while not stop.is_set():
            g.lead.complete(f"{tag} publication {i}: the records of every rank, " * 60,
                            max_tokens=1)
            i += 1
            sent[0] = i

    try:
        t = threading.Thread(target=publisher, daemon=True)
        t.start()
        # Warm up until the stall's queue is full (the same number of
        # publications for the baseline).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            f = g.lead.metrics().get("flare_host_cache_store_failures_total")
            if (stall and f > 0) or (not stall and sent[0] >= 24):
                break
            time.sleep(0.1)
        f0 = g.lead.metrics().get("flare_host_cache_store_failures_total")
        gaps, end = [], time.monotonic() + seconds
        k = 0
        while time.monotonic() < end:
            s = g.lead.stream("/v1/completions", {"prompt": f"decode {k} ", "max_tokens": 32,
                                                  "temperature": 0})
            ts = s.token_times()
            gaps += [(b - a) * 1000 for a, b in zip(ts, ts[1:])]
            k += 1
        failures = g.lead.metrics().get("flare_host_cache_store_failures_total") - f0
        stop.set()
        t.join(30)
        return gaps, failures, sent[0]
    finally:
        stop.set()
        g.kill_all()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flare")
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args()
    install_cleanup()
    flare = find_flare(a.flare)
    with TempDir("flare-bench-ranks-") as tmp:
        base, _, bsent = run(flare, tmp, "base", False, a.seconds)
        st, fails, ssent = run(flare, tmp, "stall", True, a.seconds)
    b50, b99, s50, s99 = pct(base, 50), pct(base, 99), pct(st, 50), pct(st, 99)
    print(f"baseline: {len(base)} gaps, {bsent} publications; stall: {len(st)} gaps, {ssent} "
          f"publications, {fails:.0f} stores refused while measuring")
    print(f"RESULT ranks_stall_baseline_p50 {b50:.3f} ms")
    print(f"RESULT ranks_stall_baseline_p99 {b99:.3f} ms")
    print(f"RESULT ranks_stall_p50 {s50:.3f} ms")
    print(f"RESULT ranks_stall_p99 {s99:.3f} ms")
    print(f"RESULT ranks_stall_p50_ratio {s50 / b50:.3f} ratio")
    print(f"RESULT ranks_stall_p99_ratio {s99 / b99:.3f} ratio")
    print(f"RESULT ranks_stall_store_failures {fails:.0f} stores")
    return 0 if fails > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
