#!/usr/bin/env python3
"""Ranks in separate processes over a real interface (issue 17; the guide's
"ip netns for multi-host tests"): rank 0 of qwen-tp2-small in a network
namespace of its own, rank 1 in another, joined by a veth pair on a private
range, so the rendezvous and every step's reductions cross the veth, never
loopback; rank 0's HTTP is reached over a second veth from this namespace.
The completions equal the same core's in one process, and the peer's
interface carried the traffic.  Then the host prefix cache across the veth
(qualify/multihost_cache.py run(), issue 17 part B): each rank with its own
record directory in its own namespace, a GPU-cache hit, a host restore after
evicting the GPU copies and a restore after restarting both ranks, with the
tokens of one process and the same file names and lengths on both ranks
after each phase; the rank link's traffic crossed the veth too.  Exit 77
without root or `ip netns`.

Everything is named after this process's pid and deleted by name at the
end, on SIGTERM, and (for namespaces whose test process is gone) by the
next run."""
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, TempDir, install_cleanup  # noqa: E402
import multihost_cache as mc  # noqa: E402
from ranks import Ranks  # noqa: E402

flare = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
core = os.path.join(src, "cores", "qwen-tp2-small.core")
PID = os.getpid()
TAG = f"selnr-{PID}"
NS = [f"{TAG}-0", f"{TAG}-1"]
IF = {"a": f"sr{PID % 1000000}a", "b": f"sr{PID % 1000000}b",
      "g": f"sr{PID % 1000000}g", "h": f"sr{PID % 1000000}h"}
NET = f"10.{128 + PID % 100}"


def ip(*args, check=True):
    return subprocess.run(["ip"] + list(args), capture_output=True, text=True, timeout=20,
                          check=check)


def sweep():
    """Namespaces of earlier runs whose process is gone."""
    out = ip("netns", "list", check=False).stdout
    for name in re.findall(r"^(selnr-(\d+)-\d)", out, re.M):
        if not os.path.exists(f"/proc/{name[1]}"):
            ip("netns", "del", name[0], check=False)


def teardown():
    for n in NS:
        ip("netns", "del", n, check=False)  # deletes the veth ends inside
    ip("link", "del", IF["h"], check=False)


if os.geteuid() != 0 or not shutil.which("ip") or ip("netns", "list", check=False).returncode:
    print("skip: needs root and ip netns")
    sys.exit(77)
sweep()
atexit.register(teardown)
install_cleanup()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
try:
    for n in NS:
        ip("netns", "add", n)
    # The rank link: a in rank 0's namespace, b in rank 1's.
    ip("link", "add", IF["a"], "type", "veth", "peer", "name", IF["b"])
    ip("link", "set", IF["a"], "netns", NS[0])
    ip("link", "set", IF["b"], "netns", NS[1])
    ip("-n", NS[0], "addr", "add", f"{NET}.1.1/24", "dev", IF["a"])
    ip("-n", NS[1], "addr", "add", f"{NET}.1.2/24", "dev", IF["b"])
    # HTTP: g in rank 0's namespace, h here.
    ip("link", "add", IF["h"], "type", "veth", "peer", "name", IF["g"])
    ip("link", "set", IF["g"], "netns", NS[0])
    ip("-n", NS[0], "addr", "add", f"{NET}.9.1/24", "dev", IF["g"])
    ip("addr", "add", f"{NET}.9.2/24", "dev", IF["h"])
    for n, ifs in ((NS[0], [IF["a"], IF["g"], "lo"]), (NS[1], [IF["b"], "lo"])):
        for i in ifs:
            ip("-n", n, "link", "set", i, "up")
    ip("link", "set", IF["h"], "up")
except subprocess.CalledProcessError as e:
    print(f"skip: cannot make the namespaces: {e.stderr.strip()}")
    sys.exit(77)

prompts = [("Ranks on two hosts compute one core's step together", 0, 32),
           ("Each host keeps its own rank's page planes and rows", 0.7, 24)]
with Flare(flare, core=core) as one:
    want = [one.complete(p, max_tokens=n, temperature=t, seed=3)["choices"][0]["text"]
            for p, t, n in prompts]
exec_in = {r: ["ip", "netns", "exec", NS[r]] for r in (0, 1)}
with Ranks(flare, core, 2, prefix=exec_in, host=f"{NET}.9.1",
           rendezvous=f"{NET}.1.1:0") as g:
    assert g.addr.startswith(f"{NET}.1.1:"), g.addr
    got = [g.lead.complete(p, max_tokens=n, temperature=t, seed=3)["choices"][0]["text"]
           for p, t, n in prompts]
    dev = subprocess.run(exec_in[1] + ["cat", "/proc/net/dev"], capture_output=True, text=True,
                         check=True).stdout
assert got == want, f"over the veth {got} != one process {want}"
m = re.search(re.escape(IF["b"]) + r":\s*(\d+)\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+(\d+)",
              dev)
rx, tx = int(m.group(1)), int(m.group(2))
assert rx > 10000 and tx > 10000, (rx, tx)
print(f"rank 1 in {NS[1]}: {IF['b']} received {rx} bytes, sent {tx}; completions equal one "
      f"process's: {got[0]!r}")


def peer_bytes():
    dev = subprocess.run(exec_in[1] + ["cat", "/proc/net/dev"], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(re.escape(IF["b"]) + r":\s*(\d+)\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+(\d+)",
                  dev)
    return int(m.group(1)), int(m.group(2))


rx0, tx0 = peer_bytes()
with TempDir("flare-ranks-netns-") as tmp:
    print("the host prefix cache, each rank in its namespace with its own directory:")
    mc.run(flare, core, 2, tmp, prefix=exec_in, host=f"{NET}.9.1", rendezvous=f"{NET}.1.1:0")
rx1, tx1 = peer_bytes()
# Rank 1's record service wrote and read its own files: the STORE jobs
# came in over the veth, and its link's completions went out over it.
assert rx1 - rx0 > 10000 and tx1 - tx0 > 10000, (rx1 - rx0, tx1 - tx0)
print(f"over the veth during the store phases: rank 1 received {rx1 - rx0} bytes, sent "
      f"{tx1 - tx0}")
print("ok")
