#!/usr/bin/env python3
"""The README's main command works: `flare run` with a memory tier and a
disk tier (a composite store; the disk directory in the test's temporary
directory instead of build/prefix-cache) and the shutdown drain serves a
two-turn chat on a free port, the second turn reports cached tokens,
/health and /metrics answer, SIGTERM stops it with status 0, and after a
restart with the same command the second turn comes back from disk."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import die_with_parent, install_cleanup  # noqa: E402

install_cleanup()
flare = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="test_flare_run-")
cache = os.path.join(tmp, "prefix-cache")
cmd = [flare, "run", "--port", "0", "--prefix-cache-memory", "64MiB", "--prefix-cache-disk", cache,
       "--prefix-cache-drain-on-shutdown", "--dashboard", "off"]


def start():
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    port = None
    lines = []
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        proc.kill()
        sys.exit("no listening line in: " + "".join(lines))
    print("".join(lines), end="")
    return proc, f"http://127.0.0.1:{port}", "".join(lines)


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    print(proc.stderr.read(), end="")
    assert rc == 0, f"flare exited {rc}"


def post(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def metrics(base):
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        return r.read().decode()


def sample(text, name):
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def settle(base, timeout=60):
    """Until the worker is quiet with nothing live and no copy-out pinned:
    every publication has been offered to the store (docs/metrics.md,
    flare_worker_quiet)."""
    deadline = time.monotonic() + timeout
    while True:
        t = metrics(base)
        busy = sum(sample(t, n) or 0 for n in ("flare_requests_pending", "flare_requests_active",
                                              "flare_host_cache_inbound_waiting",
                                              "flare_host_cache_copyout_pins"))
        if busy == 0 and sample(t, "flare_worker_quiet") == 1:
            return t
        assert time.monotonic() < deadline, "flare did not settle: " + t[-2000:]
        time.sleep(0.02)


proc, base, startup = start()
try:
    assert "composite store" in startup, startup
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        assert json.load(r)["status"] == "ok"
    msgs = [{"role": "user", "content": "Tell me about the tides of the northern sea."}]
    r1 = post(base, "/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0})
    reply = r1["choices"][0]["message"]["content"]
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the moon?"}]
    turn2 = {"messages": msgs, "max_tokens": 8, "temperature": 0}
    r2 = post(base, "/v1/chat/completions", turn2)
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    print("turn 2:", r2["usage"], r2["flare"])
    assert cached > 0, "second turn reused nothing"
    text = metrics(base)
    assert "flare_prefill_tokens_total" in text and "flare_host_cache_slots_capacity" in text
    # The drain writes what the worker has put to the store: the restart
    # below checks the records, so the last publications must be in.
    settle(base)
except BaseException:
    proc.kill()
    proc.wait()
    shutil.rmtree(cache, ignore_errors=True)
    raise
finally:
    if proc.poll() is None:
        stop(proc)

proc, base, startup = start()
try:
    m = re.search(r"(\d+) records scanned", startup)
    assert m and int(m.group(1)) > 0, startup
    r3 = post(base, "/v1/chat/completions", turn2)
    print("turn 2 after a restart:", r3["usage"], r3["flare"])
    assert r3["flare"]["source"] == "disk" and r3["flare"]["reused_host_tokens"] > 0, r3["flare"]
    assert r3["choices"][0]["message"]["content"] == r2["choices"][0]["message"]["content"]
finally:
    stop(proc)
    shutil.rmtree(cache, ignore_errors=True)
print("ok")
