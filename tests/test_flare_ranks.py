#!/usr/bin/env python3
"""Ranks in separate processes end to end through `flare run` on loopback
(docs/multihost.md "Execution"; issue 17):

  - a TP2 core (qwen-tp2-small) as two processes and a TP4 core
    (qwen-tp4-small) as four give the same completions, greedy and sampled,
    as the same core in one process, a repeated prompt hitting the GPU
    checkpoint cache there too; SIGTERM to rank 0 stops every rank with 0;
  - a peer killed while serving stops rank 0 with status 1 and a line
    naming the rank; rank 0 killed makes the peer exit 1;
  - a peer with another core fails the startup of both, naming it;
  - --prefix-cache-memory, a rank count the core does not have and a
    missing --rendezvous are refused before anything starts."""
import os
import subprocess
import sys
import time

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, FlareError, install_cleanup  # noqa: E402
from ranks import Ranks  # noqa: E402

install_cleanup()
flare = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
cores = os.path.join(src, "cores")
PROMPTS = [("The ranks of one core compute their shares of every step and", 0, 24),
           ("Every byte a checkpoint holds feeds the next token, so", 0.8, 24),
           ("The ranks of one core compute their shares of every step and", 0, 12)]


def run_all(f):
    out = []
    for prompt, temp, n in PROMPTS:
        r = f.complete(prompt, max_tokens=n, temperature=temp, seed=7)
        out.append((r["choices"][0]["text"], r["usage"]["completion_tokens"],
                    r["flare"]["reused_gpu_tokens"] > 0))
    return out


def same_tokens(name, world):
    core = os.path.join(cores, name + ".core")
    with Flare(flare, core=core) as one:
        want = run_all(one)
    with Ranks(flare, core, world) as g:
        got = run_all(g.lead)
        rc, prc = g.stop()
    assert rc == 0 and prc == [0] * (world - 1), (rc, prc)
    assert got == want, f"{name}: {world} processes {got} != one process {want}"
    assert want[2][2], "the repeated prompt did not hit the GPU cache"
    print(f"{name}: {world} processes give the completions of one process: {got[0][0]!r}")


def peer_killed():
    core = os.path.join(cores, "qwen-tp2-small.core")
    # TP4: rank 1 killed; rank 0 exits 1 and ranks 2 and 3 stop saying why.
    g = Ranks(flare, os.path.join(cores, "qwen-tp4-small.core"), 4).start()
    g.lead.complete("hello", max_tokens=4)
    g.peers[0].kill()
    deadline = time.monotonic() + 20
    while g.lead.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    rc = g.lead.stop(check=False)
    assert rc == 1, f"rank 0 exited {rc} after its peer was killed"
    tail = g.lead.stderr_tail()
    assert "the instance stops: rank 1" in tail, tail
    for p in g.peers[1:]:
        prc = p.wait(20)
        assert prc == 1 and "rank 0 ended the instance: rank 1" in p.tail(), (prc, p.tail())
    print("a killed peer stops rank 0:", [ln for ln in tail.splitlines() if "stops" in ln][0])
    print("and the other peers:", g.peers[1].tail(1))
    # Rank 0 killed: the peer says so and exits 1.
    g = Ranks(flare, core, 2).start()
    g.lead.kill()
    rc = g.peers[0].wait(20)
    assert rc == 1 and "rank 0" in g.peers[0].tail(), (rc, g.peers[0].tail())
    print("a killed rank 0 ends its peer:", g.peers[0].tail(1))


def another_core():
    core = os.path.join(cores, "qwen-tp2-small.core")
    other = os.path.join(cores, "deepseek-tp2-small.core")
    g = Ranks(flare, core, 2, cores={1: other}, start_timeout=30)
    try:
        g.start()
        raise AssertionError("ranks with different cores started")
    except FlareError as e:
        assert "runs another core" in str(e), str(e)
    rc = g.peers[0].wait(20)
    assert rc == 1 and "another core" in g.peers[0].tail(), (rc, g.peers[0].tail())
    g.lead.kill()
    print("different cores refused:", g.peers[0].tail(1))


def refused(args, want):
    p = subprocess.run([flare, "run", "--port", "0"] + args, capture_output=True, text=True,
                       timeout=30)
    assert p.returncode != 0 and want in p.stderr, (args, p.returncode, p.stderr)
    print("refused:", p.stderr.strip().splitlines()[-1])


core2 = os.path.join(cores, "qwen-tp2-small.core")
same_tokens("qwen-tp2-small", 2)
same_tokens("qwen-tp4-small", 4)
peer_killed()
another_core()
refused(["--ranks", "2", "--rendezvous", "127.0.0.1:0", "--prefix-cache-memory", "1MiB", core2],
        "keep records on disk only")
refused(["--ranks", "4", "--rendezvous", "127.0.0.1:0", core2], "has 2 ranks")
refused(["--ranks", "2", core2], "needs --rendezvous")
refused(["--rank", "1", core2], "without --ranks")
print("ok")
