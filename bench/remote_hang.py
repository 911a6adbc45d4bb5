#!/usr/bin/env python3
"""Decode while Redis hangs (issue 16 acceptance: "a Redis that stops
answering: the worker never waits: decode latency unchanged within noise
while it hangs").

One `flare run` with a remote tier only (every lookup that the GPU cache
does not answer goes to Redis).  A long streamed generation runs while new
requests arrive every few milliseconds, each with a fresh prompt (a remote
lookup held in admission for the grace period, then a background write);
the inter-chunk times of the long stream, and its time per output token
(first to last chunk over the tokens), are the decode latency.  Rounds
alternate a running Redis (baseline) and one stopped with SIGSTOP for the
whole round.  Prints RESULT lines: the median and p99 inter-chunk time of
each, and their ratios (stopped / running; the baseline's own spread says
how noisy the machine was).

    python3 bench/remote_hang.py [--flare build/flare] [--rounds 4] [--tokens 1500] [--core F]
"""
import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "qualify"))
from flare import Flare, TempDir, die_with_parent, install_cleanup  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(d):
    port = free_port()
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
                          "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        r = subprocess.run(["redis-cli", "-p", str(port), "PING"], capture_output=True, text=True)
        if r.stdout.strip() == "PONG":
            return p, port
        time.sleep(0.02)
    p.kill()
    sys.exit("redis-server did not start")


def gaps(ts):
    return [b - a for a, b in zip(ts, ts[1:])]


def p99(v):
    v = sorted(v)
    return v[min(len(v) - 1, int(len(v) * 0.99))]


def one_round(f, tokens, tag):
    """The long stream's inter-chunk gaps while side requests arrive."""
    stop = threading.Event()
    side = []

    def traffic():
        i = 0
        while not stop.is_set():
            t0 = time.monotonic()
            f.complete(f"side request {tag} {i}: a prompt nobody asked before, about owls", 4)
            side.append(time.monotonic() - t0)
            i += 1
            time.sleep(0.005)

    th = threading.Thread(target=traffic, daemon=True)
    th.start()
    s = f.stream("/v1/completions", {"prompt": f"long decode {tag}", "max_tokens": tokens,
                                     "temperature": 0, "ignore_eos": True})
    stop.set()
    th.join(timeout=60)
    ts = s.token_times()
    return gaps(ts), side, (ts[-1] - ts[0]) / max(1, tokens - 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flare", default=os.path.join("build", "flare"))
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--core", default=None, help="core file (default: the built-in tiny core)")
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        print("skip: redis-server not installed")
        return 0
    install_cleanup()
    with TempDir("bench-remote-hang-") as tmp:
        rp, port = start_redis(tmp)
        try:
            with Flare(a.flare, ["--prefix-cache-remote", f"redis://127.0.0.1:{port}"],
                       core=a.core) as f:
                run_m, run_p, stop_m, stop_p, side_run, side_stop = [], [], [], [], [], []
                tpot = {False: [], True: []}
                for r in range(a.rounds):
                    for stopped in ((False, True) if r % 2 == 0 else (True, False)):
                        if stopped:
                            rp.send_signal(signal.SIGSTOP)
                        g, side, per_token = one_round(f, a.tokens, f"{r}{stopped}")
                        tpot[stopped].append(per_token)
                        if stopped:
                            rp.send_signal(signal.SIGCONT)
                        (stop_m if stopped else run_m).append(statistics.median(g))
                        (stop_p if stopped else run_p).append(p99(g))
                        (side_stop if stopped else side_run).extend(side)
        finally:
            rp.send_signal(signal.SIGCONT)
            rp.kill()
            rp.wait()
    us = 1e6
    print(f"RESULT remote_hang_decode_gap_p50_running_us {statistics.median(run_m) * us:.1f} us")
    print(f"RESULT remote_hang_decode_gap_p50_stopped_us {statistics.median(stop_m) * us:.1f} us")
    print(f"RESULT remote_hang_decode_gap_p99_running_us {statistics.median(run_p) * us:.1f} us")
    print(f"RESULT remote_hang_decode_gap_p99_stopped_us {statistics.median(stop_p) * us:.1f} us")
    print(f"RESULT remote_hang_decode_p50_ratio "
          f"{statistics.median(stop_m) / statistics.median(run_m):.3f} ratio")
    print(f"RESULT remote_hang_decode_p99_ratio "
          f"{statistics.median(stop_p) / statistics.median(run_p):.3f} ratio")
    print(f"RESULT remote_hang_tpot_running_us {statistics.median(tpot[False]) * us:.1f} us")
    print(f"RESULT remote_hang_tpot_stopped_us {statistics.median(tpot[True]) * us:.1f} us")
    print(f"RESULT remote_hang_tpot_ratio "
          f"{statistics.median(tpot[True]) / statistics.median(tpot[False]):.3f} ratio")
    print(f"RESULT remote_hang_tpot_baseline_spread "
          f"{max(tpot[False]) / min(tpot[False]) - 1:.3f} ratio")
    print(f"RESULT remote_hang_baseline_spread {max(run_m) / min(run_m) - 1:.3f} ratio")
    print(f"RESULT remote_hang_side_request_p50_running_ms "
          f"{statistics.median(side_run) * 1e3:.1f} ms")
    print(f"RESULT remote_hang_side_request_p50_stopped_ms "
          f"{statistics.median(side_stop) * 1e3:.1f} ms")
    print(f"RESULT remote_hang_side_request_max_stopped_ms {max(side_stop) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
