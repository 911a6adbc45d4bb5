#!/usr/bin/env python3
"""The README's main command works: `flare run` with a memory tier serves a
two-turn chat on a free port, the second turn reports cached tokens, /health
and /metrics answer, and SIGTERM stops it with status 0."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

flare = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
proc = subprocess.Popen([flare, "run", "--port", "0", "--prefix-cache-memory", "64MiB",
                         "--dashboard", "off"], stderr=subprocess.PIPE, text=True)
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
base = f"http://127.0.0.1:{port}"


def post(path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


try:
    with urllib.request.urlopen(base + "/health", timeout=10) as r:
        assert json.load(r)["status"] == "ok"
    msgs = [{"role": "user", "content": "Tell me about the tides of the northern sea."}]
    r1 = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 24, "temperature": 0})
    reply = r1["choices"][0]["message"]["content"]
    msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the moon?"}]
    r2 = post("/v1/chat/completions", {"messages": msgs, "max_tokens": 8, "temperature": 0})
    cached = r2["usage"]["prompt_tokens_details"]["cached_tokens"]
    print("turn 2:", r2["usage"], r2["flare"])
    assert cached > 0, "second turn reused nothing"
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    assert "flare_prefill_tokens_total" in text and "flare_host_cache_slots_total" in text
finally:
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    rest = proc.stderr.read()
    print(rest, end="")
assert rc == 0, f"flare exited {rc}"
print("ok")
