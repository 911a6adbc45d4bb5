"""multihost_cache.py - the ranks-on-separate-hosts qualification (design 4;
docs/multihost.md; issue 17): a multi-host core as one `flare run` per rank
on this host, each rank with its own record directory, so the sharded
transport runs between processes as it does between hosts.

    python3 qualify/multihost_cache.py                  # TP2 and TP4 small cores
    python3 qualify/multihost_cache.py --core cores/qwen-tp4-small.core
    make qualify                                        # with the other scenarios

Phases (run() below, also what tests/test_flare_ranks_disk.py and
tests/test_flare_ranks_netns.py run):
  1. a first request computes and stores its prompt's checkpoint on every
     rank; the same request again is a GPU-cache hit without a host hit;
  2. filler prompts evict the GPU copies; the request then restores from
     the ranks' disks ("disk", reused_host_tokens > 0);
  3. every rank restarts; rank 0 scans its records (the agreement keeps
     them on every rank) and the request restores from disk again.
Every answer equals the same core's in one process without a cache, and
after each phase every rank's record directory holds the same file names
and lengths.  Standard library only; exits 0 when every check passed, 1
otherwise."""
import argparse
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flare import (Flare, FlareError, TempDir, cache_split, core_ranks, find_flare,  # noqa: E402
                   geometry, gpu_cache_bytes, install_cleanup)
from ranks import Ranks  # noqa: E402

PROMPT = ("Each host keeps the record files of its own rank, and rank zero plans for all of "
          "them, so that a restore lands on every GPU at once.")
MAX_TOKENS = 12


def rank_files(base):
    """{name: length} of the record files under one rank's directory (its
    namespace directory's name differs per rank: the fingerprint)."""
    out = {}
    for root, _, files in os.walk(base):
        for f in files:
            if f.endswith(".ckpt"):
                out[f] = os.path.getsize(os.path.join(root, f))
    return out


def wait_same(dirs, what, timeout=20.0):
    """Until every rank's directory holds the same file names and lengths
    (unlinks sent to the peers may still be landing): that listing."""
    deadline = time.monotonic() + timeout
    while True:
        ls = [rank_files(d) for d in dirs]
        if all(x == ls[0] for x in ls[1:]):
            return ls[0]
        if time.monotonic() > deadline:
            raise FlareError(f"{what}: the ranks' record files differ: " +
                             "; ".join(f"rank {r}: {sorted(x.items())}" for r, x in enumerate(ls)))
        time.sleep(0.05)


def ask(f):
    r = f.complete(PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    return r["choices"][0]["text"], r["flare"]


def fillers(f, n):
    """Distinct prompts, each settled, that push older checkpoints out of
    the GPU cache."""
    for i in range(n):
        f.complete(f"filler {i}: " + "the tide comes in and goes out again " * 2, max_tokens=2)
        f.settle()


def check(cond, what):
    if not cond:
        raise FlareError(what)


def restored(g, want, dirs, phase, after):
    """The prompt restores from every rank's disk with one process's
    answer; then every rank holds the same files (that listing)."""
    text, fl = ask(g.lead)
    check(fl["source"] == "disk" and fl["reused_host_tokens"] > 0,
          f"{phase}: no host restore {after}: {fl}")
    check(text == want, f"{phase}: restored {text!r}, one process {want!r}")
    g.lead.settle()
    return fl, wait_same(dirs, phase)


def stopped(g, world):
    rc, prc = g.stop()
    check(rc == 0 and prc == [0] * (world - 1), f"stop: rank 0 {rc}, peers {prc}")


def run(flare, core, world, tmp, log=print, prefix=None, host=None, rendezvous="127.0.0.1:0",
        gpu_hit=True, extra=()):
    """The three phases for `core` as `world` processes; directories under
    tmp.  prefix/host/rendezvous as Ranks takes them (namespaces).  Returns
    the records every rank held after each phase."""
    with Flare(flare, core=core, name="one process") as one:
        want, _ = ask(one)
    dirs = [os.path.join(tmp, f"rank{r}") for r in range(world)]
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
    pb, rb = geometry(flare, core, max_active=1)
    gpu = gpu_cache_bytes(pb, rb, 1, 64)
    rows = cache_split(gpu, pb, rb, 1)[1]
    args = ["--max-active", "1", "--gpu-cache", str(gpu), "--prefix-cache-fetch", "always",
            "--prefix-cache-max-age", "off"] + list(extra)
    ra = {r: ["--prefix-cache-disk", dirs[r]] for r in range(world)}
    held = []

    def start():
        return Ranks(flare, core, world, args=args, rank_args=ra, log=None, prefix=prefix,
                     host=host, rendezvous=rendezvous).start()

    g = start()
    try:
        text, fl = ask(g.lead)
        check(text == want, f"phase 1: {world} processes answered {text!r}, one process {want!r}")
        g.lead.settle()
        if gpu_hit:
            text, fl = ask(g.lead)
            check(text == want and fl["reused_gpu_tokens"] > 0 and fl["reused_host_tokens"] == 0,
                  f"phase 1: the repeat was no GPU-cache hit: {fl}")
            g.lead.settle()
        ls = wait_same(dirs, "phase 1")
        check(len(ls) > 0, "phase 1: no record files")
        held.append(ls)
        log(f"  phase 1: computed, then a GPU-cache hit; every rank holds {len(ls)} files")
        fillers(g.lead, rows + 4)  # every GPU row cycled
        fl, ls = restored(g, want, dirs, "phase 2", "after the GPU copies were evicted")
        held.append(ls)
        log(f"  phase 2: restored {fl['reused_host_tokens']} tokens from every rank's disk; "
            f"every rank holds {len(ls)} files")
        stopped(g, world)
        g = start()
        m = re.search(r"(\d+) records scanned", "\n".join(g.lead.startup))
        check(m and int(m.group(1)) > 0, "phase 3: rank 0 scanned no records: "
              + g.lead.stderr_tail())
        fl, ls = restored(g, want, dirs, "phase 3", "after every rank restarted")
        held.append(ls)
        log(f"  phase 3: after a restart of every rank ({m.group(1)} records scanned), restored "
            f"{fl['reused_host_tokens']} tokens; every rank holds {len(ls)} files")
        stopped(g, world)
    except BaseException:
        g.kill_all()
        raise
    return held


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flare", help="the flare binary (default: build/flare)")
    ap.add_argument("--core", action="append",
                    help="a multi-rank core (repeatable; default: the TP2 and TP4 small cores)")
    ap.add_argument("--quick", action="store_true", help="the small cores (the default)")
    ap.add_argument("--full", action="store_true",
                    help="what `make qualify` runs: the same small cores (the full-size multi-rank "
                         "cores need GPUs; pass them with --core)")
    ap.add_argument("--artifacts", help="keep the record directories here")
    a = ap.parse_args()
    install_cleanup()
    flare = find_flare(a.flare)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cores = a.core or [os.path.join(root, "cores", c) for c in
                       ("qwen-tp2-small.core", "deepseek-tp2-small.core", "qwen-tp4-small.core")]
    failed = 0
    for core in cores:
        world = core_ranks(core)
        name = os.path.basename(core)
        print(f"{name}: {world} processes, one record directory each")
        try:
            if a.artifacts:
                d = os.path.join(a.artifacts, name)
                os.makedirs(d, exist_ok=True)
                run(flare, core, world, d)
            else:
                with TempDir("flare-multihost-") as d:
                    run(flare, core, world, d)
            print(f"{name}: PASS")
        except FlareError as e:
            failed += 1
            print(f"{name}: FAIL: {e}")
    print("multihost_cache:", "PASS" if not failed else f"{failed} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
