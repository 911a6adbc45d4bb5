#!/usr/bin/env python3
"""serve.py - the isolation measurements of design section 4 against
`flare run` with the host backend, baseline first.

Each measurement runs without a host store (the baseline) and then with the
composite store (the memory store while this build has no disk store),
under the same core, flags and cache sizes; rounds alternate baseline and
offload so drift hits both.  Figures:

  decode      Decode latency under copy-out: 4 clients, continuous short
              exchanges (256-token prompts, 64-token answers, each prompt
              distinct so every exchange publishes a checkpoint: the
              maximum publication rate), streamed; per-token latency p50
              and p99 from SSE arrival timestamps, tokens per second.
              Goal: within 2% of the baseline.
  prefill     Prefill throughput under copy-out: the longest prompts the
              context allows up to 32K tokens, back to back.  Goal: within
              2% of the baseline.
  inbound     Time to first token of a restore (after the GPU copy was
              evicted) against the recompute of the same prompt, for 8K,
              32K and 100K-token prefixes, from memory and from disk (the
              disk rows need the disk store).  Qwen TP1's context is 32K:
              100K runs on a copy of the core with max_context 131072,
              written to a temporary file.  Each size runs with
              --prefix-cache-overlap off (restore-only), on (the policy's
              split) and always (every hit split at its middle page), as
              --overlap-modes says; the overlapped rows are ratios to the
              better of restore-only and recompute-only (issue 18), and
              tokens_identical says whether every run's greedy first token
              was the same.  With it (restore-only rows), issue 18's
              inbound acceptance: the restore's bytes over its time from
              the fetch (started in the admitting worker pass) to its pages
              and row loaded (flare_host_cache_restore_time_seconds), as
              GB/s and as a ratio to a memcpy of the same bytes (memory)
              and to fio reading the same bytes on the same directory
              (disk), both measured in the same run (goal >= 0.8).
  copyout     Copy-out bandwidth per rank: bytes_out_total over the decode
              and prefill runs; the share of decode's publications copied
              out (the rest skipped under backpressure, design 2.10), and
              per round the store outcomes, the puts the copy-out pin bound
              held back, the retries abandoned, and samples of copy-out pins,
              free GPU rows and pending requests taken every 0.5 s, and the
              cores each kind of flare thread used (/proc: serving, the
              transfer threads' copies, the disk thread).
  restore     Decode latency under inbound (design 4): three requests decode
              at 64K context while a fourth restores a 100K-token prefix from
              disk (written by an earlier server, drained on its shutdown);
              the decoders' token gaps and rate while the restore runs
              (request sent to its first token) against the same streams'
              in the seconds before it, in the same run.  Composite only.
  spec        Speculative round time under copy-out (design 4): the decode
              workload above with --speculate copy and then learned, each
              baseline against the store; the model's time per round from
              /metrics (flare_spec_round_time_seconds: sum over count in the
              run, and the bucket holding the 99th percentile), tokens/s and
              the acceptance rate.  Goal: within noise of the baseline.
  hog         Isolation against a plain memcpy (issue 18, design 2.10
              channels): the decode workload in rounds rotating three
              configurations, the composite, the baseline beside a process
              that only copies memory at the composite's copy-out rate of
              the same round (the composite runs first; scheduled like the
              offload threads), and the
              baseline alone; composite / hog is what offload costs beyond
              moving its bytes.  The hog's moved bytes are read back.

Also printed: time per output token (per request: last token minus first
over the tokens between; mean, p50, p99) and time to first token, since in
this closed loop the SSE gap percentiles follow the batch size.  Results and
their reading are in docs/performance.md.

Prints `RESULT <name> <value> <unit>` lines (ratios are offload /
baseline; latency ratios above 1 and throughput ratios below 1 are
worse).  --quick is a smoke run on the tiny core (seconds); the default
runs Qwen TP1 (cores/qwen-tp1.core) in about eleven minutes; --full runs the
decode workload for ten minutes as the design asks.

    python3 bench/serve.py [--flare build/flare] [--quick | --full]
        [--core cores/qwen-tp1.core] [--duration S] [--rounds N]
        [--only decode,spec,hog,prefill,inbound,restore] [--spec-modes copy,learned]
"""

import argparse
import os
import random
import re
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "qualify"))
from flare import (Flare, FlareError, TempDir, cache_split, core_ranks,  # noqa: E402
                   die_with_parent, find_flare, geometry, gpu_cache_bytes, install_cleanup)

ALPHABET = "abcdefghijklmnopqrstuvwxyz      ABCDEFGHIJ.,?0123456789"
TEMPLATE = 19  # BEGIN "user: " ... MESSAGE "assistant: " around a chat message


def result(name, value, unit):
    print(f"RESULT {name} {value:.4g} {unit}", flush=True)


def text(rng, n):
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def thread_cpu(pid):
    """CPU seconds (user + system) of each thread of pid, by thread id:
    {tid: (name, seconds)}.  Threads that exit between reads are missed."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                st = fh.read()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        out[tid] = (name, (int(f[11]) + int(f[12])) / tick)
    return out


def cpu_by_role(before, after, wall):
    """Cores used during the run by role: copies (sel-xfer-*: the memory
    and disk stores' transfer threads), disk (sel-disk: checksums and I/O
    submission), and the rest of flare (model worker, HTTP threads)."""
    roles = {"copies": 0.0, "disk": 0.0, "serving": 0.0}
    for tid, (name, sec) in after.items():
        d = sec - before.get(tid, (name, 0.0))[1]
        role = ("copies" if name.startswith("sel-xfer") else
                "disk" if name.startswith("sel-disk") else "serving")
        roles[role] += d / wall
    return roles


def cpu_rows(name, runs):
    """The median CPU milliseconds by role of the runs that measured them
    (the disk restores: send to first token)."""
    runs = [x[4] for x in runs if len(x) > 4]
    for role in ("serving", "disk", "copies"):
        if runs:
            result(f"{name}_cpu_{role}", statistics.median(r[role] for r in runs) * 1e3, "ms")


def restore_seconds(m0, m1, tier):
    """Seconds of the one restore between two /metrics samples: fetch
    start to loaded pages and row, on the worker; None unless exactly one."""
    name = "flare_host_cache_restore_time_seconds"
    if m1.delta(m0, name + "_count", tier=tier) != 1:
        return None
    return m1.delta(m0, name + "_sum", tier=tier)


def memcpy_bw(nbytes, reps=3):
    """Bytes per second of one memcpy of nbytes (libc's, through ctypes;
    both buffers faulted in first), the median of reps."""
    import ctypes
    src, dst = bytearray(nbytes), bytearray(nbytes)
    a = (ctypes.c_char * nbytes).from_buffer(src)
    d = (ctypes.c_char * nbytes).from_buffer(dst)
    ctypes.memset(a, 1, nbytes)
    ctypes.memset(d, 2, nbytes)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ctypes.memmove(d, a, nbytes)
        ts.append(time.perf_counter() - t0)
    del a, d
    return nbytes / statistics.median(ts)


def fio_read_bw(directory, nbytes):
    """fio reading nbytes on directory as bench/benchlib.c does (io_uring,
    O_DIRECT, 8 MiB requests, 32 in flight): bytes per second, or None."""
    import subprocess
    path = os.path.join(directory, "fio.bench")
    size = max(8 << 20, nbytes // (8 << 20) * (8 << 20))
    try:
        out = subprocess.run(
            ["fio", "--name=selene-bench", f"--directory={directory}", "--filename=fio.bench",
             "--rw=read", "--bs=8M", "--iodepth=32", "--ioengine=io_uring", "--direct=1",
             f"--size={size}", "--numjobs=1", "--output-format=terse", "--terse-version=3"],
            capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    finally:
        if os.path.exists(path):
            os.unlink(path)
    for line in out.splitlines():
        if line.startswith("3;"):
            return float(line.split(";")[6]) * 1024
    return None


def max_context(core):
    if not core:
        return 8192
    with open(core) as fh:
        return int(re.search(r"^\s*max_context\s*=\s*(\d+)", fh.read(), re.M).group(1))


class Bench:
    def __init__(self, a):
        self.a = a
        self.flare = find_flare(a.flare)
        self.core = a.core
        self.tmp = TempDir("flare-bench-")
        try:
            self.ranks = core_ranks(self.core)
            self.pb, self.rb = geometry(self.flare, self.core, 4)
            self.store = None
            self.slot = None
            self.copyout_bps = None
            self.probe()
        except BaseException:
            self.tmp.cleanup()
            raise

    def log(self, s):
        print(f"# {s}", flush=True)

    def server(self, args, core=None, name="flare"):
        return Flare(self.flare, args, core=core or self.core, name=name)

    def gpu_args(self, pages, max_active=4, core=None):
        pb, rb = (self.pb, self.rb) if core is None else geometry(self.flare, core, max_active)
        return ["--gpu-cache", str(gpu_cache_bytes(pb, rb, max_active, pages)),
                "--max-active", str(max_active)]

    def record_bytes(self, tokens, pb=None, rb=None):
        """Pool bytes of one complete record of `tokens` tokens."""
        pb, rb = pb or self.pb, rb or self.rb
        slot = self.slot if pb == self.pb else pb + 4096 * 64
        return (-(-tokens // 64) + 1 + -(-rb // (slot // self.ranks)) + 1) * slot

    def probe(self):
        """Which store a memory size plus a disk directory selects, and the
        slot size."""
        d = os.path.join(self.tmp.path, "probe")
        with self.server(self.gpu_args(8) + ["--prefix-cache-memory", "1MiB",
                                              "--prefix-cache-disk", d], name="probe") as srv:
            self.store = srv.store()
            self.slot = int(srv.metrics().value("flare_host_cache_slot_bytes"))
            note = srv.disk_note()
        if self.store != "composite":
            self.store = "memory"
            self.log(f"no composite store in this build ({note}): offload runs use the "
                     "memory store")

    def offload_args(self, memory, drain=False):
        """The store the measurements compare against the baseline."""
        a = ["--prefix-cache-memory", str(memory)]
        if self.a.offload_sched:
            a += ["--offload-sched", self.a.offload_sched]
        if self.store == "composite":
            d = os.path.join(self.tmp.path, f"cache-{time.monotonic_ns()}")
            a += ["--prefix-cache-disk", d, "--prefix-cache-disk-limit", "8GiB"]
            if drain:
                a.append("--prefix-cache-drain-on-shutdown")
        return a

    # ---- decode latency under copy-out ---------------------------------------

    def decode_run(self, srv, duration, seed):
        stop_at = time.monotonic() + duration
        lock = threading.Lock()
        gaps, ttfts, tpots, tokens, exchanges = [], [], [], [0], [0]
        errors = []

        def client(cid):
            rng = random.Random(seed * 100 + cid)
            k = 0
            while time.monotonic() < stop_at:
                k += 1
                content = f"{cid}.{k} " + text(rng, 256 - TEMPLATE - len(f"{cid}.{k} "))
                body = {"messages": [{"role": "user", "content": content}], "max_tokens": 64,
                        "temperature": 0, "stream_options": {"include_usage": True}}
                try:
                    s = srv.stream("/v1/chat/completions", body)
                except FlareError as e:
                    errors.append(str(e))
                    return
                ts = s.token_times()
                u = s.usage() or {}
                with lock:
                    if ts:
                        ttfts.append(ts[0] - s.sent)
                        gaps.extend(b - a for a, b in zip(ts, ts[1:]))
                        if len(ts) > 1:
                            tpots.append((ts[-1] - ts[0]) / (len(ts) - 1))
                    tokens[0] += u.get("completion_tokens", 0)
                    exchanges[0] += 1

        # Sampled during the run: GPU checkpoints pinned by copy-outs, free
        # GPU rows, requests waiting for admission.
        samples = []

        def sampler():
            while time.monotonic() < stop_at:
                try:
                    m = srv.metrics()
                except FlareError:
                    break
                samples.append((m.get("flare_host_cache_copyout_pins"),
                                m.get("flare_gpu_cache_rows_free"),
                                m.get("flare_requests_pending")))
                time.sleep(0.5)

        m0 = srv.metrics()
        c0 = thread_cpu(srv.proc.pid)
        t0 = time.monotonic()
        th = [threading.Thread(target=client, args=(c,)) for c in range(4)]
        th.append(threading.Thread(target=sampler))
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.monotonic() - t0
        cpu = cpu_by_role(c0, thread_cpu(srv.proc.pid), wall)
        m1 = srv.metrics()
        if errors:
            raise FlareError("decode client failed: " + errors[0])
        def hmean(name):
            """Mean of histogram `name` over the run, in ms (nan if empty)."""
            n = m1.delta(m0, name + "_count")
            return m1.delta(m0, name + "_sum") / n * 1e3 if n else float("nan")

        return {
            "p50": pct(gaps, 0.5) * 1e3, "p99": pct(gaps, 0.99) * 1e3,
            # Token-weighted, client and server side: the client's mean gap
            # between text chunks, and the engine's own mean interval between
            # a request's tokens at delivery (flare_time_per_output_token);
            # the difference is the delivery path (HTTP threads, socket,
            # client).  Queue time: submission to admission, what a copy-out
            # pin that holds a GPU row makes a prompt wait (design 2.10).
            "gap_mean": statistics.mean(gaps) * 1e3 if gaps else float("nan"),
            "srv_tpot": hmean("flare_time_per_output_token_seconds"),
            "queue_ms": hmean("flare_request_queue_time_seconds"),
            "ttft_p50": pct(ttfts, 0.5) * 1e3,
            "tpot": statistics.mean(tpots) * 1e3 if tpots else float("nan"),
            "tpot_p50": pct(tpots, 0.5) * 1e3, "tpot_p99": pct(tpots, 0.99) * 1e3,
            "tps": tokens[0] / wall, "exchanges": exchanges[0],
            "tokens_per_exchange": tokens[0] / max(exchanges[0], 1),
            "out_bps": m1.delta(m0, "flare_host_cache_bytes_out_total", tier="dram") / wall,
            "publications": m1.delta(m0, "flare_host_cache_publications_total"),
            "skipped": m1.delta(m0, "flare_host_cache_store_outcomes_total", outcome="skipped"),
            "queued": m1.delta(m0, "flare_host_cache_store_outcomes_total", outcome="queued"),
            "retries": m1.delta(m0, "flare_host_cache_store_outcomes_total", outcome="retry"),
            "pin_waits": m1.delta(m0, "flare_host_cache_copyout_pin_waits_total"),
            "abandoned": (m1.sum("flare_host_cache_retry_abandoned_total")
                          - m0.sum("flare_host_cache_retry_abandoned_total")),
            "pins_max": max((x[0] for x in samples), default=0),
            "rows_free_min": min((x[1] for x in samples), default=0),
            "pending_mean": statistics.mean(x[2] for x in samples) if samples else 0,
            "cpu": cpu,
            "wall": wall,
        }

    def paired(self, run_one):
        """Rounds alternating which configuration goes first (baseline,
        offload; offload, baseline; ...), so drift and first-run effects
        fall on both.  Returns {"baseline": [...], "offload": [...]}."""
        runs = {"baseline": [], "offload": []}
        for rnd in range(self.a.rounds):
            order = ("baseline", "offload") if rnd % 2 == 0 else ("offload", "baseline")
            for kind in order:
                runs[kind].append(run_one(kind, rnd))
        return runs

    def report(self, name, unit, runs, key):
        """Medians of each configuration, the median of the per-round
        ratios, and the baseline's own spread (max/min - 1) as the noise."""
        b = [r[key] for r in runs["baseline"]]
        o = [r[key] for r in runs["offload"]]
        result(f"serve_{name}_baseline", statistics.median(b), unit)
        result(f"serve_{name}_{self.store}", statistics.median(o), unit)
        result(f"serve_{name}_ratio", statistics.median(y / x for x, y in zip(b, o)), "ratio")
        if len(b) > 1:
            result(f"serve_{name}_baseline_spread", max(b) / min(b) - 1, "ratio")

    def decode(self):
        dur = self.a.duration
        pages = 4 * 8 + 64
        mem = self.record_bytes(320) * 24

        def one(kind, rnd):
            args = self.gpu_args(pages)
            if kind == "offload":
                args += self.offload_args(mem)
            with self.server(args, name=kind) as srv:
                # Warm-up: fill the GPU cache and the pool's first slots.
                self.decode_run(srv, min(3.0, dur / 5), seed=999)
                r = self.decode_run(srv, dur, seed=rnd)
            self.log(f"decode round {rnd + 1} {kind}: token gap p50 {r['p50']:.3f} ms, p99 "
                     f"{r['p99']:.3f} ms, mean per-request time per output token "
                     f"{r['tpot']:.3f} ms (p50 {r['tpot_p50']:.3f}, p99 {r['tpot_p99']:.3f}), "
                     f"{r['tps']:.0f} tok/s, {r['exchanges']} exchanges "
                     f"({r['tokens_per_exchange']:.1f} tokens each), ttft p50 "
                     f"{r['ttft_p50']:.1f} ms, copy-out {r['out_bps'] / 2**20:.0f} MiB/s, "
                     f"{r['publications']:.0f} publications, {r['queued']:.0f} copies queued, "
                     f"{r['retries']:.0f} retry outcomes, {r['pin_waits']:.0f} held back by the "
                     f"pin bound, {r['abandoned']:.0f} retries abandoned, {r['skipped']:.0f} "
                     f"skipped; sampled: copy-out pins <= {r['pins_max']:.0f}, GPU rows free >= "
                     f"{r['rows_free_min']:.0f}, {r['pending_mean']:.1f} requests pending; "
                     f"cores used: serving {r['cpu']['serving']:.2f}, copies "
                     f"{r['cpu']['copies']:.2f}, disk thread {r['cpu']['disk']:.2f}")
            return r

        runs = self.paired(one)
        self.report("decode_token_p50", "ms", runs, "p50")
        self.report("decode_token_p99", "ms", runs, "p99")
        self.report("decode_tpot", "ms", runs, "tpot")
        self.report("decode_tok_s", "tok/s", runs, "tps")
        self.report("decode_ttft_p50", "ms", runs, "ttft_p50")
        self.copyout_bps = statistics.median(r["out_bps"] for r in runs["offload"])
        result("serve_copyout_decode_per_rank", self.copyout_bps / self.ranks / 2**20, "MiB/s")
        # Backpressure (design 2.10): the share of publications copied out;
        # the rest was skipped (retried unpinned, then abandoned).
        result("serve_decode_copied_fraction",
               statistics.median(r["queued"] / max(r["publications"], 1) for r in runs["offload"]),
               "ratio")
        # Attribution (design 2.10 CPU channel): cores the offload threads
        # took from a 2-core machine, and what serving itself used.
        for role in ("serving", "copies", "disk"):
            for kind in ("baseline", "offload"):
                result(f"serve_decode_cores_{role}_{kind}",
                       statistics.median(r["cpu"][role] for r in runs[kind]), "cores")

    HOG_SRC = (
        "import os, signal, sys, time\n"
        "cls, rate = sys.argv[1], float(sys.argv[2])\n"
        "pol = {'other': os.SCHED_OTHER, 'batch': os.SCHED_BATCH, 'idle': os.SCHED_IDLE}[cls]\n"
        # Nice 10 as flare sets its offload threads' (eos_thread_lower_priority:
        # absolute, raised only): under `nice python3 bench/serve.py` flare and
        # its copy and disk threads all run at 10, and a relative os.nice(10)
        # put the hog at 19, below them.
        "os.sched_setscheduler(0, pol, os.sched_param(0))\n"
        "cur = os.getpriority(os.PRIO_PROCESS, 0)\n"
        "if cur < 10: os.setpriority(os.PRIO_PROCESS, 0, 10)\n"
        "os.write(2, f'hog nice {os.getpriority(os.PRIO_PROCESS, 0)}\\n'.encode())\n"
        "mib = max(1, min(104, int(rate / 40 / 2**20)))  # a copy-out's row, or less when slow\n"
        "src = bytearray(os.urandom(1 << 20)) * mib; dst = bytearray(len(src))\n"
        "done = 0; t0 = time.monotonic()\n"
        "def stop(*_):\n"
        "    os.write(1, f'{done} {time.monotonic() - t0}\\n'.encode()); os._exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "os.write(1, b'ready\\n')\n"
        "while True:\n"
        "    dst[:] = src; done += len(src)\n"
        "    ahead = done / rate - (time.monotonic() - t0)\n"
        "    if ahead > 0: time.sleep(ahead)\n")

    def hog(self):
        """Isolation against a plain memcpy (issue 18; design 2.10 channels):
        in the same run, rounds of three configurations: the composite, the
        baseline next to a process that only copies memory (up to 104 MiB
        memcpys, paced) at the copy-out rate the composite measured in the
        same round (it always runs before the hog), scheduled like the
        offload threads (--offload-sched, nice 10), and the baseline alone,
        whose place rotates.  composite / hog is what offload costs
        beyond moving its bytes; hog / baseline what moving them costs.
        The hog's own bytes and time are read back (SIGTERM makes it print
        them), so the run shows it moved the composite's bytes at its rate."""
        import subprocess
        dur = self.a.duration
        pages = 4 * 8 + 64
        mem = self.record_bytes(320) * 24
        cls = self.a.offload_sched or "other"
        rate = [self.copyout_bps or self.a.hog_rate * 2**20]
        kinds = ("composite", "hog", "baseline")

        def one(kind, rnd):
            args = self.gpu_args(pages)
            if kind == "composite":
                args += self.offload_args(mem)
            h = None
            with self.server(args, name=f"iso-{kind}") as srv:
                self.decode_run(srv, min(3.0, dur / 5), seed=999)
                if kind == "hog":
                    h = subprocess.Popen([sys.executable, "-c", self.HOG_SRC, cls, str(rate[0])],
                                         stdout=subprocess.PIPE, preexec_fn=die_with_parent)
                    h.stdout.readline()
                try:
                    r = self.decode_run(srv, dur, seed=rnd)
                finally:
                    if h:
                        hc = thread_cpu(h.pid)
                        h.terminate()
                        out = h.stdout.read().split()
                        h.wait()
                        r["hog_bps"] = float(out[0]) / float(out[1]) if len(out) == 2 else 0.0
                        r["hog_target_bps"] = rate[0]
                        r["hog_cores"] = sum(v[1] for v in hc.values()) / r["wall"]
            if kind == "composite":
                rate[0] = r["out_bps"]
            extra = (f", hog moved {r['hog_bps'] / 2**20:.0f} MiB/s (asked "
                     f"{r['hog_target_bps'] / 2**20:.0f}), hog cores {r['hog_cores']:.2f}"
                     if kind == "hog" else
                     f", copy-out {r['out_bps'] / 2**20:.0f} MiB/s, {r['queued']:.0f} copies"
                     if kind == "composite" else "")
            self.log(f"iso round {rnd + 1} {kind}: {r['tps']:.0f} tok/s, time per output token "
                     f"{r['tpot']:.3f} ms (p50 {r['tpot_p50']:.3f}), token gap p99 {r['p99']:.3f} ms, ttft p50 "
                     f"{r['ttft_p50']:.1f} ms; token gap mean {r['gap_mean']:.3f} ms at the client, "
                     f"{r['srv_tpot']:.3f} ms in the engine; queue time mean {r['queue_ms']:.2f} ms; "
                     f"cores serving {r['cpu']['serving']:.2f}, copies "
                     f"{r['cpu']['copies']:.2f}, disk thread {r['cpu']['disk']:.2f}{extra}")
            return r

        runs = {k: [] for k in kinds}
        # The composite runs before the hog in every round, so the hog moves
        # that round's copy-out bytes at its rate (the composite's rate moved
        # 2x between rounds, and a rotation that ran the hog first gave it the
        # previous round's); the baseline's place rotates.
        orders = (("composite", "hog", "baseline"), ("baseline", "composite", "hog"),
                  ("composite", "baseline", "hog"))
        for rnd in range(self.a.hog_rounds):
            for kind in orders[rnd % 3]:
                runs[kind].append(one(kind, rnd))
        med = statistics.median
        for key, unit, name in (("tps", "tok/s", "decode_tok_s"), ("tpot", "ms", "decode_tpot"),
                                ("tpot_p50", "ms", "decode_tpot_p50"),
                                ("p99", "ms", "decode_token_p99"),
                                ("ttft_p50", "ms", "decode_ttft_p50"),
                                ("gap_mean", "ms", "decode_gap_mean"),
                                ("srv_tpot", "ms", "decode_server_tpot"),
                                ("queue_ms", "ms", "decode_queue_time")):
            c, h, b = ([r[key] for r in runs[k]] for k in kinds)
            for k, v in zip(kinds, (c, h, b)):
                result(f"serve_iso_{name}_{k}", med(v), unit)
            result(f"serve_iso_{name}_composite_over_hog",
                   med(y / x for x, y in zip(h, c)), "ratio")
            result(f"serve_iso_{name}_hog_over_baseline",
                   med(y / x for x, y in zip(b, h)), "ratio")
            result(f"serve_iso_{name}_composite_over_baseline",
                   med(y / x for x, y in zip(b, c)), "ratio")
            for k, v in zip(kinds, (c, h, b)):
                if len(v) > 1:
                    result(f"serve_iso_{name}_{k}_spread", max(v) / min(v) - 1, "ratio")
        # The hog against the composite's copy-out of the same run.
        cbps = med(r["out_bps"] for r in runs["composite"])
        hbps = med(r["hog_bps"] for r in runs["hog"])
        result("serve_iso_copyout_composite", cbps / 2**20, "MiB/s")
        result("serve_iso_moved_hog", hbps / 2**20, "MiB/s")
        result("serve_iso_hog_over_copyout", hbps / cbps if cbps else float("nan"), "ratio")
        # Per round: the hog's bytes over the composite's of the same round
        # (equal run lengths, so this is the rate ratio too).
        per = [h["hog_bps"] / c["out_bps"] if c["out_bps"] else float("nan")
               for h, c in zip(runs["hog"], runs["composite"])]
        result("serve_iso_hog_over_copyout_round_min", min(per), "ratio")
        result("serve_iso_hog_over_copyout_round_max", max(per), "ratio")
        # Attribution by channel: the cores each kind of thread used.
        for role in ("serving", "copies", "disk"):
            for k in kinds:
                result(f"serve_iso_cores_{role}_{k}", med(r["cpu"][role] for r in runs[k]),
                       "cores")
        result("serve_iso_cores_hog", med(r["hog_cores"] for r in runs["hog"]), "cores")

    # ---- speculative round time under copy-out ----------------------------------

    @staticmethod
    def bucket_quantile(m1, m0, name, q, **labels):
        """The upper bound (s) of the histogram bucket holding quantile q of
        the observations between two snapshots."""
        rows = []
        for ls in m1.labels(name + "_bucket"):
            if all(ls.get(k) == v for k, v in labels.items()):
                le = ls["le"]
                rows.append((float("inf") if le == "+Inf" else float(le),
                             m1.delta(m0, name + "_bucket", **ls)))
        rows.sort()
        total = rows[-1][1] if rows else 0
        for le, cum in rows:
            if total and cum >= q * total:
                return le
        return float("nan")

    def spec(self):
        dur = self.a.duration
        pages = 4 * 8 + 64
        mem = self.record_bytes(320) * 24
        hist = "flare_spec_round_time_seconds"
        for mode in self.a.spec_modes.split(","):
            def one(kind, rnd, mode=mode):
                args = self.gpu_args(pages) + ["--speculate", mode]
                if kind == "offload":
                    args += self.offload_args(mem)
                with self.server(args, name=f"{mode}-{kind}") as srv:
                    self.decode_run(srv, min(3.0, dur / 5), seed=999)
                    m0 = srv.metrics()
                    r = self.decode_run(srv, dur, seed=rnd)
                    m1 = srv.metrics()
                n = m1.delta(m0, hist + "_count", mode=mode)
                r["rounds"] = n
                r["round_us"] = m1.delta(m0, hist + "_sum", mode=mode) / n * 1e6 if n else float("nan")
                r["round_p99_le_us"] = self.bucket_quantile(m1, m0, hist, 0.99, mode=mode) * 1e6
                prop = m1.delta(m0, "flare_spec_proposed_tokens_total", mode=mode)
                r["acceptance"] = m1.delta(m0, "flare_spec_accepted_tokens_total", mode=mode) / max(prop, 1)
                r["per_round"] = m1.delta(m0, "flare_spec_emitted_tokens_total", mode=mode) / max(n, 1)
                self.log(f"spec {mode} round {rnd + 1} {kind}: {n:.0f} rounds, model time per "
                         f"round {r['round_us']:.1f} us (p99 in the bucket up to "
                         f"{r['round_p99_le_us']:.0f} us), {r['per_round']:.2f} tokens per round, "
                         f"acceptance {r['acceptance']:.3f}, {r['tps']:.0f} tok/s, token gap p99 "
                         f"{r['p99']:.3f} ms, copy-out {r['out_bps'] / 2**20:.0f} MiB/s")
                return r

            runs = self.paired(one)
            self.report(f"spec_{mode}_round_time", "us", runs, "round_us")
            self.report(f"spec_{mode}_round_p99_bucket", "us", runs, "round_p99_le_us")
            self.report(f"spec_{mode}_decode_tok_s", "tok/s", runs, "tps")
            self.report(f"spec_{mode}_acceptance", "ratio", runs, "acceptance")

    # ---- prefill throughput under copy-out --------------------------------------

    def prefill(self):
        ctx = max_context(self.core)
        L = min(32768, ctx) - 64
        n = self.a.prefill_prompts
        pages = -(-L // 64) + 16
        mem = self.record_bytes(L) * 3

        def one(kind, rnd):
            args = self.gpu_args(pages, max_active=1)
            if kind == "offload":
                args += self.offload_args(mem)
            with self.server(args, name=kind) as srv:
                rng = random.Random(7 + rnd)
                for w in range(2):  # warm-up: touch the pages and the pool
                    srv.complete(text(random.Random(w), L), max_tokens=1)
                srv.wait_idle(600)
                m0 = srv.metrics()
                t_req = []
                t0 = time.monotonic()
                for _ in range(n):
                    s = time.monotonic()
                    r = srv.complete(text(rng, L), max_tokens=1)
                    t_req.append(time.monotonic() - s)
                    assert r["flare"]["prefill_tokens"] == L, r["flare"]
                wall = time.monotonic() - t0
                m1 = srv.metrics()
                out = m1.delta(m0, "flare_host_cache_bytes_out_total", tier="dram")
            rr = {"tps": n * L / sum(t_req), "out_bps": out / wall}
            self.log(f"prefill round {rnd + 1} {kind}: {n} prompts of {L} tokens, "
                     f"{rr['tps']:.0f} tok/s, copy-out {rr['out_bps'] / 2**20:.0f} MiB/s")
            return rr

        runs = self.paired(one)
        self.report(f"prefill_{L}_tok_s", "tok/s", runs, "tps")
        result("serve_copyout_prefill_per_rank",
               statistics.median(r["out_bps"] for r in runs["offload"]) / self.ranks / 2**20,
               "MiB/s")

    # ---- inbound latency ----------------------------------------------------------

    def big_core(self, need):
        """The core, or a copy of it with a larger max_context."""
        if max_context(self.core) >= need:
            return self.core
        with open(self.core) as fh:
            txt = fh.read()
        txt = re.sub(r"^(\s*max_context\s*=\s*)\d+", lambda m: m.group(1) + "131072", txt,
                     flags=re.M)
        path = os.path.join(self.tmp.path, "long-context.core")
        with open(path, "w") as fh:
            fh.write(txt)
        self.log(f"{os.path.basename(self.core)} has max_context {max_context(self.core)}: "
                 f"the {need}-token prefix runs on a copy with max_context 131072 ({path})")
        return path

    def ttft(self, srv, prompt):
        s = srv.stream("/v1/completions", {"prompt": prompt, "max_tokens": 1, "temperature": 0})
        fin = s.final()
        t = s.events[0][0] - s.sent if s.events else float("nan")
        return t, (fin or {}).get("flare", {})

    def inbound_round(self, L, core, args, mem, fill, prompt, label, overlap):
        """One server (and, with a composite, its restart): the cold prompt's
        time to first token (recompute), then the same prompt restored from
        memory after fillers evicted its GPU copy and, after a restart, from
        disk; --prefix-cache-overlap as given.  Each restore as (ttft, bytes
        in, text, overlap tokens); None where it did not restore."""
        out = {"recompute": None, "memory": None, "disk": None, "texts": []}
        ov = ["--prefix-cache-overlap", overlap]
        with self.server(args + ov + self.offload_args(mem, drain=True), core=core,
                         name=f"inbound-{overlap}") as srv:
            s = srv.stream("/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                               "temperature": 0})
            t_re = s.events[0][0] - s.sent if s.events else float("nan")
            f_re = (s.final() or {}).get("flare", {})
            assert f_re.get("prefill_tokens") == len(prompt), f_re
            out["recompute"] = t_re
            out["texts"].append(s.text())
            srv.wait_idle(600)
            for i in range(fill):  # evict the GPU copy
                srv.complete(f"filler {i} " + text(random.Random(i), 300), max_tokens=1)
            m0 = srv.wait_idle(600)
            s = srv.stream("/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                               "temperature": 0})
            t_me = s.events[0][0] - s.sent if s.events else float("nan")
            f_me = (s.final() or {}).get("flare", {})
            m1 = srv.wait_idle(600)
            out["texts"].append(s.text())
            if f_me.get("source") != "memory":
                self.log(f"inbound {label} overlap {overlap}: no memory restore: {f_me}, "
                         f"declined {m1.value('flare_host_cache_fetch_declined_total'):.0f}")
            else:
                out["memory"] = (t_me, m1.delta(m0, "flare_host_cache_bytes_in_total",
                                                tier="dram"), f_me.get("overlap_tokens", 0),
                                 restore_seconds(m0, m1, "dram"))
        if self.store == "composite":
            with self.server(args + ov + srv.args[srv.args.index("--prefix-cache-memory"):],
                             core=core, name=f"inbound-restart-{overlap}") as srv2:
                m0 = srv2.metrics()
                c0 = thread_cpu(srv2.proc.pid)
                s = srv2.stream("/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                                    "temperature": 0})
                t_di = s.events[0][0] - s.sent if s.events else float("nan")
                f_di = (s.final() or {}).get("flare", {})
                # CPU seconds by role over the restore (issue 18: the head on
                # the worker against the tail's disk and copy threads).
                cpu = cpu_by_role(c0, thread_cpu(srv2.proc.pid), 1.0)
                m1 = srv2.wait_idle(600)
                out["texts"].append(s.text())
                if f_di.get("source") == "disk":
                    out["disk"] = (t_di, m1.delta(m0, "flare_host_cache_bytes_in_total",
                                                  tier="nvme"), f_di.get("overlap_tokens", 0),
                                   restore_seconds(m0, m1, "nvme"), cpu)
                    d = srv2.args[srv2.args.index("--prefix-cache-disk") + 1]
                    out["disk_dir"] = os.path.dirname(d.rstrip("/")) or "."
                    if out["disk"][3] and out["disk"][1] > 0:
                        out["fio_read"] = fio_read_bw(out["disk_dir"], int(out["disk"][1]))
                else:
                    self.log(f"inbound {label} overlap {overlap}: no disk restore after "
                             f"restart: {f_di}")
        return out

    def inbound_bandwidth(self, label, tier, runs, fio):
        """Issue 18's inbound acceptance: a restore's bytes over its time
        from the fetch's start (the admission: start_fetch runs in the same
        worker pass) to its pages and row loaded on the worker
        (flare_host_cache_restore_time_seconds), against memcpy of the same
        bytes in this process (memory; median of three) and fio reading the
        same bytes on the same directory (disk), both in this run.  Goal:
        >= 0.8 of each."""
        rs = [(x[1], x[3]) for x in runs if x[3] and x[1] > 0]
        if not rs:
            return
        b = statistics.median(x[0] for x in rs)
        bw = statistics.median(x[0] / x[1] for x in rs)
        result(f"serve_inbound_{label}_{tier}_restore_seconds",
               statistics.median(x[1] for x in rs), "s")
        result(f"serve_inbound_{label}_{tier}_restore_gbps", bw / 1e9, "GB/s")
        if tier == "memory":
            base = memcpy_bw(int(b))
            result(f"serve_inbound_{label}_memcpy_gbps", base / 1e9, "GB/s")
            result(f"serve_inbound_{label}_memory_restore_vs_memcpy", bw / base, "ratio")
        elif fio:
            base = statistics.median(fio)
            result(f"serve_inbound_{label}_fio_read_gbps", base / 1e9, "GB/s")
            result(f"serve_inbound_{label}_disk_restore_vs_fio", bw / base, "ratio")

    def inbound(self):
        """Restore-only (--prefix-cache-overlap off), recompute-only (the
        cold prompt) and overlapped (on: the policy's split; always: every
        hit split at its middle page) time to first token, per size and
        tier, in alternating rounds; the greedy first token of every run
        must be the same (issue 18: "tokens identical in every case")."""
        sizes = [8192, 32768, 102400] if not self.a.quick else [1024, 4096]
        if self.a.inbound_sizes:
            sizes = [int(x) for x in self.a.inbound_sizes.split(",")]
        ctx = max_context(self.core)
        modes = self.a.overlap_modes.split(",")
        for L in sizes:
            core = self.core if L <= ctx else self.big_core(L)
            pb, rb = geometry(self.flare, core, 1)
            pages = -(-L // 64) + 16
            # Fillers cycle every GPU row, evicting the prompt's checkpoint.
            fill = cache_split(gpu_cache_bytes(pb, rb, 1, pages), pb, rb, 1)[1] + 4
            mem = int((self.record_bytes(L, pb, rb) + fill * self.record_bytes(320, pb, rb)) * 1.2)
            args = self.gpu_args(pages, 1, core)
            label = f"{L // 1024}k"
            tiers = ["memory", "disk"] if self.store == "composite" else ["memory"]
            rec, texts = [], set()
            rest = {(t, m): [] for t in tiers for m in modes}
            fio = []  # fio read of each round's restored bytes, on its disk's directory
            for rnd in range(self.a.inbound_rounds):
                prompt = text(random.Random(1000 * L + rnd), L - 1)
                first = None
                for m in modes:
                    o = self.inbound_round(L, core, args, mem, fill, prompt, label, m)
                    rec.append(o["recompute"])
                    first = first if first is not None else o["texts"][0]
                    texts.update((rnd, x == first) for x in o["texts"])
                    for t in tiers:
                        if o[t]:
                            rest[(t, m)].append(o[t])
                    if m == "off" and o.get("fio_read"):
                        fio.append(o["fio_read"])
            t_rec = statistics.median(rec)
            result(f"serve_inbound_{label}_recompute_ttft", t_rec * 1e3, "ms")
            result(f"serve_inbound_{label}_tokens_identical",
                   1 if all(same for _, same in texts) else 0, "bool")
            for t in tiers:
                off = rest.get((t, "off"))
                if not off and "off" in modes:
                    continue
                t_off = statistics.median(x[0] for x in off) if off else float("nan")
                if off:  # restore-only: the names of the runs before issue 18
                    b = statistics.median(x[1] for x in off)
                    result(f"serve_inbound_{label}_{t}_ttft", t_off * 1e3, "ms")
                    cpu_rows(f"serve_inbound_{label}_{t}", off)
                    result(f"serve_inbound_{label}_{t}_vs_recompute", t_off / t_rec, "ratio")
                    result(f"serve_inbound_{label}_{t}_bytes", b / 2**20, "MiB")
                    self.inbound_bandwidth(label, t, off, fio)
                best = min(t_off, t_rec) if off else t_rec
                for m in modes:
                    if m == "off" or not rest[(t, m)]:
                        continue
                    tm = statistics.median(x[0] for x in rest[(t, m)])
                    head = statistics.median(x[2] for x in rest[(t, m)])
                    result(f"serve_inbound_{label}_{t}_overlap_{m}_ttft", tm * 1e3, "ms")
                    result(f"serve_inbound_{label}_{t}_overlap_{m}_head_tokens", head, "tokens")
                    result(f"serve_inbound_{label}_{t}_overlap_{m}_vs_best", tm / best, "ratio")
                    cpu_rows(f"serve_inbound_{label}_{t}_overlap_{m}", rest[(t, m)])
            if self.store != "composite":
                self.log(f"inbound {label} from disk: skipped (no disk store in this build)")

    # ---- decode latency under inbound ------------------------------------------------

    def restore(self):
        if self.store != "composite":
            self.log("restore: skipped (no disk store in this build)")
            return
        big, ctx = (102400, 65536) if not self.a.quick else (4096, 2048)
        core = self.core if big + 64 <= max_context(self.core) else self.big_core(big)
        pb, rb = geometry(self.flare, core, 4)
        decode_tokens = 30000 if not self.a.quick else 600
        pages = 3 * (-(-(ctx + decode_tokens) // 64)) + -(-big // 64) + 64
        args = self.gpu_args(pages, 4, core)
        mem = int(self.record_bytes(big, pb, rb) * 1.5)
        runs = []
        for rnd in range(self.a.inbound_rounds):
            prompt = text(random.Random(5000 + rnd), big - 1)
            d = os.path.join(self.tmp.path, f"restore-{rnd}")
            store = ["--prefix-cache-memory", str(mem), "--prefix-cache-disk", d,
                     "--prefix-cache-disk-limit", "8GiB"]
            # An earlier server computes the prefix; its drain writes it.
            with self.server(args + store + ["--prefix-cache-drain-on-shutdown"], core=core,
                             name="restore-seed") as srv:
                srv.complete(prompt, max_tokens=1)
                srv.wait_idle(600)
            with self.server(args + store, core=core, name="restore") as srv:
                lock = threading.Lock()
                started = threading.Barrier(4)
                streams, errors = [], []

                def decoder(i):
                    p = text(random.Random(7000 + 10 * rnd + i), ctx - 1)
                    try:
                        s = srv.stream("/v1/completions",
                                       {"prompt": p, "max_tokens": decode_tokens,
                                        "temperature": 0, "ignore_eos": True},
                                       timeout=600, on_first=started.wait)
                    except Exception as e:  # noqa: BLE001 - reported below
                        errors.append(str(e))
                        started.abort()
                        return
                    with lock:
                        streams.append(s)

                th = [threading.Thread(target=decoder, args=(i,)) for i in range(3)]
                for t in th:
                    t.start()
                started.wait(600)  # every decoder has its first token
                time.sleep(1.0)    # decoding at full batch before the restore
                c_pre = thread_cpu(srv.proc.pid)
                time.sleep(1.0)
                c0 = thread_cpu(srv.proc.pid)
                cpu_before = cpu_by_role(c_pre, c0, 1.0)
                m0 = srv.metrics()
                t_send = time.monotonic()
                t_first, fl = self.ttft(srv, prompt)
                t_done = t_send + t_first
                cpu_during = cpu_by_role(c0, thread_cpu(srv.proc.pid), t_first)
                m1 = srv.metrics()
                for t in th:
                    t.join()
                if errors:
                    raise FlareError("restore decoder failed: " + errors[0])
            if fl.get("source") != "disk":
                self.log(f"restore round {rnd + 1}: the prefix did not come from disk: {fl}")
                continue
            before, during = [], []
            n_before = n_during = 0
            for s in streams:
                ts = s.token_times()
                for a, b in zip(ts, ts[1:]):
                    if t_send - 1.5 <= a and b <= t_send:
                        before.append(b - a)
                    elif a >= t_send and b <= t_done:
                        during.append(b - a)
                n_before += sum(1 for t in ts if t_send - 1.5 < t <= t_send)
                n_during += sum(1 for t in ts if t_send < t <= t_done)
            if len(during) < 3:
                self.log(f"restore round {rnd + 1}: only {len(during)} token gaps during a "
                         f"{t_first * 1e3:.0f} ms restore")
                continue
            r = {"p50_before": pct(before, 0.5) * 1e3, "p99_before": pct(before, 0.99) * 1e3,
                 "p50_during": pct(during, 0.5) * 1e3, "p99_during": pct(during, 0.99) * 1e3,
                 "tps_before": n_before / 1.5, "tps_during": n_during / t_first,
                 "restore_ms": t_first * 1e3, "cpu_before": cpu_before,
                 "cpu_during": cpu_during,
                 "bytes": m1.delta(m0, "flare_host_cache_bytes_in_total", tier="nvme")}
            self.log(f"restore round {rnd + 1}: {big}-token prefix from disk "
                     f"({r['bytes'] / 2**20:.0f} MiB) in {r['restore_ms']:.0f} ms while 3 "
                     f"requests decode at {ctx} context: token gap p50 {r['p50_before']:.2f} -> "
                     f"{r['p50_during']:.2f} ms, p99 {r['p99_before']:.2f} -> "
                     f"{r['p99_during']:.2f} ms, {r['tps_before']:.0f} -> "
                     f"{r['tps_during']:.0f} tok/s; flare's cores: serving "
                     f"{cpu_before['serving']:.2f} -> {cpu_during['serving']:.2f}, copies "
                     f"{cpu_before['copies']:.2f} -> {cpu_during['copies']:.2f}, disk thread "
                     f"{cpu_before['disk']:.2f} -> {cpu_during['disk']:.2f}")
            runs.append(r)
        if not runs:
            return
        label = f"{big // 1024}k"
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]
               if not k.startswith("cpu")}
        result(f"serve_restore_{label}_disk_ms", med["restore_ms"], "ms")
        for q in ("p50", "p99"):
            result(f"serve_restore_decode_token_{q}_before", med[f"{q}_before"], "ms")
            result(f"serve_restore_decode_token_{q}_during", med[f"{q}_during"], "ms")
            result(f"serve_restore_decode_token_{q}_ratio",
                   statistics.median(r[f"{q}_during"] / r[f"{q}_before"] for r in runs),
                   "ratio")
        result("serve_restore_decode_tok_s_ratio",
               statistics.median(r["tps_during"] / r["tps_before"] for r in runs), "ratio")

    def run(self):
        try:
            print(f"# flare {self.flare}, core {self.core or 'tiny (built-in)'}, "
                  f"page {self.pb} B, row {self.rb} B, {self.ranks} rank(s)", flush=True)
            only = self.a.only.split(",")
            if "decode" in only:
                self.decode()
            if "spec" in only:
                self.spec()
            if "hog" in only:
                self.hog()
            if "prefill" in only:
                self.prefill()
            if "inbound" in only:
                self.inbound()
            if "restore" in only:
                self.restore()
        finally:
            self.tmp.cleanup()


def main(argv=None):
    install_cleanup()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flare")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="smoke run on the tiny core")
    g.add_argument("--full", action="store_true", help="ten-minute decode runs")
    ap.add_argument("--core", help="core file (default cores/qwen-tp1.core; --quick: tiny)")
    ap.add_argument("--duration", type=float, help="seconds per decode run")
    ap.add_argument("--rounds", type=int, help="baseline/offload rounds")
    ap.add_argument("--prefill-prompts", type=int)
    ap.add_argument("--inbound-rounds", type=int)
    ap.add_argument("--overlap-modes", default="off,on,always",
                    help="--prefix-cache-overlap modes the inbound rows run (off is "
                    "restore-only; the ratios are against the better of it and recompute)")
    ap.add_argument("--inbound-sizes",
                    help="prefix tokens of the inbound rows, comma-separated "
                    "(default 8192,32768,102400; --quick 1024,4096)")
    ap.add_argument("--hog-rounds", type=int)
    ap.add_argument("--only", default="decode,spec,hog,prefill,inbound,restore",
                    help="measurements: decode, spec (speculative round time under copy-out), "
                    "hog (attribution of decode), prefill, inbound, restore (decode under "
                    "inbound)")
    ap.add_argument("--spec-modes", default="copy,learned",
                    help="the speculation modes the spec measurement runs")
    ap.add_argument("--offload-sched", choices=("other", "batch", "idle"),
                    help="flare's --offload-sched for the offload runs (and the hog's class); "
                    "default: flare's own")
    ap.add_argument("--hog-rate", type=float, default=4900,
                    help="MiB/s of the hog's memcpy when decode did not run first")
    a = ap.parse_args(argv)
    if a.quick:
        a.core = a.core
        defaults = dict(duration=3, rounds=2, prefill_prompts=2, inbound_rounds=1, hog_rounds=3)
    elif a.full:
        a.core = a.core or os.path.join(ROOT, "cores", "qwen-tp1.core")
        defaults = dict(duration=600, rounds=2, prefill_prompts=8, inbound_rounds=3,
                        hog_rounds=2)
    else:
        a.core = a.core or os.path.join(ROOT, "cores", "qwen-tp1.core")
        defaults = dict(duration=20, rounds=4, prefill_prompts=4, inbound_rounds=2, hog_rounds=3)
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    print("# " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]), flush=True)
    Bench(a).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
