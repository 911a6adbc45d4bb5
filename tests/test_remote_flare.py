#!/usr/bin/env python3
"""The remote tier in `flare run` (issue 16 part B), against real
redis-server processes on loopback.

Two `flare run` instances with separate local directories stand for two
hosts: B restores what A published, with source "remote" and the same
tokens as a run without offload -- through a standalone server (A and B
with disk tiers in directories of their own) and through a three-master
cluster made with `redis-cli --cluster create` (no local tier: every
restore comes from Redis).  Faults: a value rewritten by a client without
the key (refused with a key, counted; random damage refused without one);
Redis killed (requests recompute, serving goes on) and restarted empty
(reconnects; a cold cache); a Redis that stops answering (SIGSTOP):
requests are answered by recomputation within a bounded time, the worker
never waits on the socket; a Redis too small for what A writes (maxmemory,
allkeys-lru): every answer right, restored or recomputed; in the cluster,
a slot migrated during traffic, half (ASK) and whole (MOVED).

Servers are started on ports picked by binding first (redis-server has no
port 0), waited for by condition with deadlines, and stopped by PID.  Exit
77 without redis-server.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, TempDir, die_with_parent, install_cleanup  # noqa: E402
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from remote_fixture import BIN, CLI, REDIS, Redis, ask, free_port, reconnected, wait_for, written  # noqa: E402,F401

install_cleanup()
PROMPTS = [
    "Tell me about the tides of the northern sea, and the moon that pulls them, at length.",
    "A second conversation about lighthouses, their keepers and the ships they guided home.",
    "Third: the long history of the printing press and of the people who set its type.",
]


# The tiny core recomputes a prompt in microseconds, so the restore policy
# would rightly prefer recomputing once it has measured a round trip: the
# instances restore every hit (the policy itself is test_policy's).
ALWAYS = ["--prefix-cache-fetch", "always"]


def metrics(f):
    return f.metrics()


def baseline(tmp):
    with Flare(BIN, [], name="baseline") as f:
        return [ask(f, p)[0] for p in PROMPTS]


def standalone(tmp, want):
    r = Redis(tmp, "standalone").start()
    url = f"redis://127.0.0.1:{r.port}"
    key = os.path.join(tmp, "remote.key")
    with open(key, "wb") as k:
        k.write(os.urandom(32))
    os.chmod(key, 0o600)
    try:
        a_args = ALWAYS + ["--prefix-cache-disk", os.path.join(tmp, "a"),
                           "--prefix-cache-remote", url]
        b_args = ALWAYS + ["--prefix-cache-disk", os.path.join(tmp, "b"),
                           "--prefix-cache-remote", url]
        with Flare(BIN, a_args, name="A") as a:
            assert "remote tier " + url in a.summary() and "1 node: 127.0.0.1:" in a.summary(), \
                a.summary()
            assert [ask(a, p)[0] for p in PROMPTS[:2]] == want[:2]
            # A second turn of the first conversation, on A only.
            turn2 = PROMPTS[0] + want[0] + " And what of the spring tides, then?"
            want_turn2 = ask(a, turn2)[0]
            written(a, 3)
        with Flare(BIN, b_args, name="B") as b:
            text, fl = ask(b, PROMPTS[0])
            assert fl["source"] == "remote" and fl["reused_host_tokens"] > 0, fl
            assert text == want[0], (text, want[0])
            m = metrics(b)
            assert m.get("flare_remote_hits_total") >= 1 and m.get("flare_remote_bytes_in_total") > 0
            assert m.get("flare_remote_connection_state") == 1
            assert m.get("flare_remote_round_trip_seconds_count") > 0
            print("standalone: B restored from remote:", fl)
            # B's GPU holds turn 1: the remote restore is the rest of turn 2
            # only, above the GPU-resident prefix.
            text, fl = ask(b, turn2)
            assert fl["source"] == "remote" and fl["reused_gpu_tokens"] > 0 and \
                fl["reused_host_tokens"] > 0, fl
            assert text == want_turn2, (text, want_turn2)
            print("standalone: turn 2 over a GPU-resident turn 1:", fl)

            # Random damage without a key: a byte of a window's payload
            # flipped is refused by the manifest's page checksums.
            names = [n for n in r.cli("--scan", "--pattern", "flare:*:w0").split() if n]
            assert names, "no window on Redis"
            for n in names:
                r.cli("SETRANGE", n, "200", "\x7f\x7e\x7d")
            text, fl = ask(b, PROMPTS[1])
            assert text == want[1] and fl["source"] != "remote", fl
            m = metrics(b)
            assert m.get("flare_remote_corrupt_total") >= 1, m.text[-3000:]
            print("standalone: damaged window refused, recomputed:", fl)

        # With a key: A writes authenticated values; a client without the
        # key rewrites one (a well-formed value it cannot authenticate).
        r.cli("FLUSHALL")
        ka = a_args + ["--prefix-cache-remote-key", key]
        kb = b_args + ["--prefix-cache-remote-key", key, "--prefix-cache-remote-encrypt"]
        shutil.rmtree(os.path.join(tmp, "a"), ignore_errors=True)
        shutil.rmtree(os.path.join(tmp, "b"), ignore_errors=True)
        with Flare(BIN, ka, name="A-key") as a:
            assert "key flare-" in a.summary() and "encryption off" in a.summary(), a.summary()
            assert ask(a, PROMPTS[2])[0] == want[2]
            written(a, 1)
        names = [n for n in r.cli("--scan", "--pattern", "flare-*:w0").split() if n]
        assert names and not r.cli("--scan", "--pattern", "flare:*").split(), "key prefix"
        for n in names:
            v = r.cli("GETRANGE", n, "0", "119")  # a header alone: forged, no valid tag
            r.cli("SETRANGE", n, "130", "forged")
            assert v is not None
        with Flare(BIN, kb, name="B-key") as b:
            assert "encryption on" in b.summary(), b.summary()
            text, fl = ask(b, PROMPTS[2])
            assert text == want[2] and fl["source"] != "remote", fl
            m = metrics(b)
            assert m.get("flare_remote_auth_failures_total") >= 1, m.text[-3000:]
            print("standalone: forged value refused with a key:", fl)
            # B recomputed and published; its encrypted write replaces the
            # record, which a fresh host restores.
            written(b, 1)
        shutil.rmtree(os.path.join(tmp, "b"), ignore_errors=True)
        # The same settings from [prefix_cache] of a config file.
        conf = os.path.join(tmp, "flare.toml")
        with open(conf, "w") as fh:
            fh.write(f'[prefix_cache]\nfetch = "always"\ndisk = "{os.path.join(tmp, "b")}"\n'
                     f'remote = "{url}"\nremote_key = "{key}"\nremote_encrypt = true\n')
        with Flare(BIN, ["--config", conf], name="C-key") as c:
            assert "key flare-" in c.summary() and "encryption on" in c.summary(), c.summary()
            text, fl = ask(c, PROMPTS[2])
            assert fl["source"] == "remote" and text == want[2], fl
            print("standalone: encrypted record restored:", fl)
    finally:
        r.stop()


def faults(tmp, want):
    r = Redis(tmp, "faults").start()
    url = f"redis://127.0.0.1:{r.port}"
    args = ALWAYS + ["--prefix-cache-remote", url]  # no local tier: every restore is remote
    try:
        with Flare(BIN, args, name="A") as a, Flare(BIN, args, name="B") as b:
            assert a.store() == "remote" or "remote store" in a.summary(), a.summary()
            assert ask(a, PROMPTS[0])[0] == want[0]
            written(a, 1)
            text, fl = ask(b, PROMPTS[0])
            assert fl["source"] == "remote" and text == want[0], fl

            # Redis stops answering: requests still complete by recompute
            # within a bounded time (grace period, then local work).
            r.proc.send_signal(signal.SIGSTOP)
            t0 = time.monotonic()
            text, fl = ask(b, PROMPTS[1])
            took = time.monotonic() - t0
            assert text == want[1] and fl["source"] != "remote", fl
            assert took < 10, f"a request took {took:.1f} s while Redis hung"
            t0 = time.monotonic()
            text, fl = ask(a, PROMPTS[2])
            assert text == want[2] and time.monotonic() - t0 < 10
            print(f"stopped Redis: answered by recompute in {took:.2f} s")
            r.proc.send_signal(signal.SIGCONT)

            # Redis killed and restarted empty on the same port: misses,
            # recomputation, reconnection, then sharing resumes.
            r.kill()
            text, fl = ask(b, PROMPTS[1])
            assert text == want[1] and fl["source"] != "remote", fl
            r.start(port=r.port)
            for f in (a, b):
                wait_for(f.name + " reconnected", lambda: reconnected(f.metrics()))
            before = metrics(a).get("flare_remote_puts_total", result="stored")
            extra = "A fourth prompt, written after the restart, about rivers and their deltas."
            base_extra = ask(a, extra)[0]
            written(a, before + 1)
            text, fl = ask(b, extra)
            assert fl["source"] == "remote" and text == base_extra, fl
            print("restarted empty Redis: reconnected and shared again:", fl)
    finally:
        r.stop()


def unix_and_db(tmp, want):
    """unix:///PATH reaches a server on its socket; redis://HOST:PORT/DB
    keeps databases apart (a host on DB 4 does not see DB 3's records)."""
    # A socket path must stay under 108 bytes: a short directory of its own.
    sdir = tempfile.mkdtemp(prefix="trf-", dir="/tmp")
    sock = os.path.join(sdir, "redis.sock")
    r = Redis(tmp, "unix")
    r.extra = ["--unixsocket", sock, "--unixsocketperm", "700"]
    r.start()
    try:
        with Flare(BIN, ALWAYS + ["--prefix-cache-remote", "unix://" + sock], name="A") as a:
            assert "remote tier unix://" + sock in a.summary(), a.summary()
            assert ask(a, PROMPTS[1])[0] == want[1]
            written(a, 1)
        with Flare(BIN, ALWAYS + ["--prefix-cache-remote", "unix://" + sock], name="B") as b:
            text, fl = ask(b, PROMPTS[1])
            assert fl["source"] == "remote" and text == want[1], fl
        db3 = f"redis://127.0.0.1:{r.port}/3"
        with Flare(BIN, ALWAYS + ["--prefix-cache-remote", db3], name="A3") as a:
            assert ask(a, PROMPTS[2])[0] == want[2]
            written(a, 1)
        with Flare(BIN, ALWAYS + ["--prefix-cache-remote", db3[:-1] + "4"], name="B4") as b:
            text, fl = ask(b, PROMPTS[2])
            assert fl["source"] != "remote" and text == want[2], fl
        with Flare(BIN, ALWAYS + ["--prefix-cache-remote", db3], name="B3") as b:
            text, fl = ask(b, PROMPTS[2])
            assert fl["source"] == "remote" and text == want[2], fl
        print("unix socket and databases: restored through the socket, DB 4 apart from DB 3")
    finally:
        r.stop()
        shutil.rmtree(sdir, ignore_errors=True)


def eviction(tmp):
    """A Redis too small for what A writes (maxmemory, allkeys-lru): B gets
    every answer right, restored where the record survived whole and
    recomputed where a window or manifest was evicted."""
    r = Redis(tmp, "small")
    r.extra = ["--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru"]
    r.start()
    url = f"redis://127.0.0.1:{r.port}"
    prompts = [f"Conversation {i}: " + "the quick brown fox jumps over the lazy dog; " * 4
               for i in range(40)]
    try:
        with Flare(BIN, ALWAYS + ["--prefix-cache-remote", url], name="A") as a:
            want = [ask(a, p)[0] for p in prompts]
            written(a, 1)
        evicted = int(next((ln.split(":")[1] for ln in r.cli("INFO", "stats").splitlines()
                            if ln.startswith("evicted_keys:")), "0"))
        assert evicted > 0, "nothing was evicted: the test does not test eviction"
        with Flare(BIN, ALWAYS + ["--prefix-cache-remote", url], name="B") as b:
            sources = []
            # Newest first: B's own writes (of what it recomputes) evict
            # the least recently used records, the oldest.
            for p, w in reversed(list(zip(prompts, want))):
                text, fl = ask(b, p)
                assert text == w, (p, text, w, fl)
                sources.append(fl["source"])
            assert "remote" in sources and "none" in sources, sources
        print(f"eviction: {evicted} keys evicted; B: {sources.count('remote')} restored, "
              f"{len(sources) - sources.count('remote')} recomputed, every answer right")
    finally:
        r.stop()


def manifest_of(nodes, consumed):
    """(node, key) of the manifest of the record at `consumed` tokens."""
    tag = f"/{consumed:016x}-"
    for n in nodes:
        for k in n.cli("--scan", "--pattern", "flare:*:m").split():
            if tag in k:
                return n, k
    raise AssertionError(f"no manifest of a record at {consumed} tokens")


def migrate(nodes, where, only_manifest=False):
    """Move the slot of a record's keys to another master by hand
    (IMPORTING / MIGRATING / MIGRATE / SETSLOT NODE).  only_manifest: stop
    halfway, the manifest on the new owner and the windows still on the
    old, both nodes in their migration states (what ASK is for); the
    migration is then finished after one request."""
    src, key = where
    dst = next(n for n in nodes if n is not src)
    slot = src.cli("CLUSTER", "KEYSLOT", key).strip()
    sid, did = src.cli("CLUSTER", "MYID").strip(), dst.cli("CLUSTER", "MYID").strip()
    assert "OK" in dst.cli("CLUSTER", "SETSLOT", slot, "IMPORTING", sid)
    assert "OK" in src.cli("CLUSTER", "SETSLOT", slot, "MIGRATING", did)
    keys = [k for k in src.cli("CLUSTER", "GETKEYSINSLOT", slot, "1000").split() if k]
    move = [key] if only_manifest else keys
    r = src.cli("MIGRATE", "127.0.0.1", str(dst.port), "", "0", "5000", "KEYS", *move)
    assert "OK" in r, r
    if only_manifest:
        return lambda: finish(nodes, src, dst, slot, did)
    finish(nodes, src, dst, slot, did)


def finish(nodes, src, dst, slot, did):
    rest = [k for k in src.cli("CLUSTER", "GETKEYSINSLOT", slot, "1000").split() if k]
    if rest:
        r = src.cli("MIGRATE", "127.0.0.1", str(dst.port), "", "0", "5000", "KEYS", *rest)
        assert "OK" in r, r
    for n in nodes:
        assert "OK" in n.cli("CLUSTER", "SETSLOT", slot, "NODE", did)


def cluster(tmp, want):
    nodes = [Redis(tmp, f"node{i}", cluster=True) for i in range(3)]
    try:
        for n in nodes:
            n.start()
        addrs = [f"127.0.0.1:{n.port}" for n in nodes]
        subprocess.run([CLI, "--cluster", "create"] + addrs +
                       ["--cluster-replicas", "0", "--cluster-yes"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        wait_for("the cluster", lambda: all("cluster_state:ok" in n.cli("CLUSTER", "INFO")
                                            for n in nodes), timeout=60)
        url = "redis-cluster://" + addrs[0]
        args = ALWAYS + ["--prefix-cache-remote", url]
        with Flare(BIN, args, name="A") as a:
            assert "(3 nodes:" in a.summary(), a.summary()
            answers = [ask(a, p) for p in PROMPTS]
            assert [t for t, _ in answers] == want
            written(a, 3)
        lengths = [fl["prefill_tokens"] for _, fl in answers]
        with Flare(BIN, args, name="B") as b:
            # B's client reaches every master first (slow under TSan): a
            # lookup that only then finds its node would miss the grace.
            wait_for("B connected to the three masters",
                     lambda: (lambda m: m.get("flare_remote_connection_state") == 1
                              and m.get("flare_remote_nodes_up") == 3)(b.metrics()))
            text, fl = ask(b, PROMPTS[0])
            assert fl["source"] == "remote" and text == want[0], fl
            # Prompt 1's record half moved to another master (its manifest
            # moved, its windows not yet): ASK is followed.
            done = migrate(nodes, manifest_of(nodes, lengths[1]), only_manifest=True)
            text, fl = ask(b, PROMPTS[1])
            assert fl["source"] == "remote" and text == want[1], fl
            assert b.metrics().get("flare_remote_redirects_total", kind="ask") >= 1
            done()
            # Prompt 2's record moved whole: MOVED is followed.
            migrate(nodes, manifest_of(nodes, lengths[2]))
            text, fl = ask(b, PROMPTS[2])
            assert fl["source"] == "remote" and text == want[2], fl
            assert b.metrics().get("flare_remote_redirects_total", kind="moved") >= 1
            print("cluster: B restored every prompt from remote, following ASK and MOVED")
        keys = sum(int(n.cli("DBSIZE").strip() or 0) for n in nodes)
        spread = sum(1 for n in nodes if int(n.cli("DBSIZE").strip() or 0) > 0)
        print(f"cluster: {keys} keys on {spread} masters")
    finally:
        for n in nodes:
            n.stop()


def bad_settings(tmp):
    """Clear errors before anything starts."""
    key = os.path.join(tmp, "short.key")
    with open(key, "wb") as k:
        k.write(b"too short")
    os.chmod(key, 0o600)
    loose = os.path.join(tmp, "loose.key")
    with open(loose, "wb") as k:
        k.write(os.urandom(32))
    os.chmod(loose, 0o644)
    cases = [
        (["--prefix-cache-remote", "rediss://h:1"], "rediss"),
        (["--prefix-cache-remote", "redis://h:0"], "port"),
        (["--prefix-cache-remote", "redis://127.0.0.1:1", "--prefix-cache-remote-key", key],
         key),
        (["--prefix-cache-remote", "redis://127.0.0.1:1", "--prefix-cache-remote-key", loose],
         loose),
        (["--prefix-cache-remote", "redis://127.0.0.1:1", "--prefix-cache-remote-encrypt"],
         "needs a key"),
        (["--prefix-cache-remote-key", loose], "no remote tier"),
    ]
    for args, want in cases:
        p = subprocess.run([BIN, "run", "--port", "0", "--dashboard", "off"] + args,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and want in p.stderr, (args, p.returncode, p.stderr)
    print("bad settings refused:", len(cases))


with TempDir("test_remote_flare-", os.environ.get("TEST_TMPDIR")) as tmp:
    bad_settings(tmp)
    want = baseline(tmp)
    standalone(tmp, want)
    faults(tmp, want)
    eviction(tmp)
    unix_and_db(tmp, want)
    cluster(tmp, want)
print("ok")
