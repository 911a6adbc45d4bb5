#!/usr/bin/env python3
"""The official `openai` npm client against `flare run` (issue 14's
acceptance): non-streaming and streaming chat and completions, stop, n,
list prompts, logprobs, models.list and models.retrieve, and error cases
(a bad role, an unknown model, a wrong API key).  Every call must parse,
and each result must equal what the same request sent raw returns, with
the properties tests/test_flare_http.c asserts against the fake engine
(stop text never returned, one choice per index, a logprobs entry per
shown token, OpenAI's error shape).

The client is installed by this test from the npm registry into the
build directory ($SELENE_BUILD/npm, once); without node, npm or the
registry the test is skipped (exit 77)."""
import base64
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zlib

CLIENT = "openai@7.59.0"
build = os.path.abspath(os.environ.get("SELENE_BUILD", "build"))
src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
flare = os.path.join(build, "flare")
moddir = os.path.join(build, "npm")
KEY = "sk-test-openai-client"


def skip(why):
    print("SKIP:", why)
    sys.exit(77)


def install_client():
    if shutil.which("node") is None or shutil.which("npm") is None:
        skip("node or npm is not installed")
    if os.path.exists(os.path.join(moddir, "node_modules", "openai", "package.json")):
        return
    os.makedirs(moddir, exist_ok=True)
    try:
        r = subprocess.run(["npm", "install", "--prefix", moddir, "--no-audit", "--no-fund",
                            "--loglevel=error", CLIENT], capture_output=True, text=True,
                           timeout=240)
    except subprocess.TimeoutExpired:
        skip("npm install timed out (registry not reachable?)")
    if r.returncode != 0:
        skip("npm install %s failed (registry not reachable?): %s" % (CLIENT, r.stderr[-400:]))


def start(*extra):
    proc = subprocess.Popen([flare, "run", "--port", "0", "--dashboard", "off", "--api-key", KEY]
                            + list(extra), stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            return proc, "http://127.0.0.1:%s" % m.group(1)
    proc.kill()
    sys.exit("flare did not start")


def stop_server(proc, name):
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=60)
    proc.stderr.close()
    if rc != 0:
        failures.append("%s exited %d" % (name, rc))


def raw(base, path, body):
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json",
                                  "Authorization": "Bearer " + KEY})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)


def text_of(kind, c):
    return c["message"]["content"] if kind == "chat" else c["text"]


failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def compare(base, call):
    kind, body, name = call["kind"], dict(call["body"]), call["name"]
    body.pop("stream_options", None)
    body.pop("stream", None)
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    want = raw(base, path, body)
    got = call["choices"]
    check(len(got) == len(want["choices"]), "%s: %d choices, raw %d" % (name, len(got), len(want["choices"])))
    for g, w in zip(got, want["choices"]):
        check(g["index"] == w["index"], "%s: choice %d in order" % (name, w["index"]))
        check(g["text"] == text_of(kind, w), "%s: choice %d text %r == raw %r" %
              (name, w["index"], g["text"], text_of(kind, w)))
        check(g["finish_reason"] == w["finish_reason"], "%s: choice %d finish %s == raw %s" %
              (name, w["index"], g["finish_reason"], w["finish_reason"]))
        if body.get("logprobs"):
            lp = w["logprobs"]
            n = len(lp["content"]) if kind == "chat" else len(lp["tokens"])
            if call["stream"]:
                check(g["tokens"] == n, "%s: %d logprobs entries streamed, raw %d" % (name, g["tokens"], n))
            else:
                check(g["logprobs"] == lp, "%s: logprobs equal the raw ones" % name)
            check(n > 0, "%s: logprobs present" % name)
    u = call.get("usage")
    if u is not None:
        for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
            check(u[k] == want["usage"][k], "%s: usage.%s %s == raw %s" % (name, k, u[k], want["usage"][k]))
    return want


install_client()
proc, base = start()
try:
    r = subprocess.run(["node", os.path.join(src, "tests", "openai_client.js"), moddir, base + "/v1", KEY],
                       capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        sys.exit("the openai client failed:\n" + r.stderr + r.stdout[-2000:])
    calls = json.loads(r.stdout)
    by = {c["name"]: c for c in calls}
    print("the openai client made %d calls" % len(calls))
    for c in calls:
        if "choices" in c:
            compare(base, c)
    # What the C tests assert, seen through the client.
    chat = by["chat"]
    check(chat["object"] == "chat.completion" and chat["id"].startswith("chatcmpl-"), "chat: object and id")
    check(by["chat stream"]["chunks"] >= 3 and by["chat stream"]["usage"] is not None,
          "chat stream: chunks and the usage chunk")
    reply = chat["choices"][0]["text"]
    stop = reply[3:5] if len(reply) >= 6 else reply[:1]
    for n in ("chat stop", "chat stop stream"):
        t = by[n]["choices"][0]["text"]
        check(by[n]["choices"][0]["finish_reason"] == "stop" and t == reply[:reply.find(stop)] and stop not in t,
              "%s: %r cut before %r" % (n, t, stop))
    check(by["completion stop"]["choices"][0]["finish_reason"] == "stop", "completion stop: finish stop")
    check([c["index"] for c in by["chat n"]["choices"]] == [0, 1, 2], "chat n: indexes 0, 1, 2")
    check([c["index"] for c in by["chat n stream"]["choices"]] == [0, 1], "chat n stream: indexes 0, 1")
    check(len(by["completion list"]["choices"]) == 3, "completion list: a choice per prompt")
    check(len(by["completion token lists"]["choices"]) == 4, "token lists with n 2: four choices")
    lp = by["chat logprobs"]["choices"][0]["logprobs"]["content"]
    check(all(len(e["top_logprobs"]) == 3 and e["logprob"] <= 0 for e in lp), "chat logprobs: 3 alternatives each")
    clp = by["completion logprobs"]["choices"][0]["logprobs"]
    check(len(clp["tokens"]) == len(clp["token_logprobs"]) == len(clp["text_offset"]), "completion logprobs: aligned")
    m = by["models"]
    check(m["ids"] == ["tiny"] and m["retrieved"]["id"] == "tiny" and m["retrieved"]["object"] == "model",
          "models.list and models.retrieve")
    e = by["bad role"]["error"]
    check(e and e["status"] == 400 and e["param"] == "messages[0].role" and e["type"] == "invalid_request_error",
          "bad role: 400 naming messages[0].role (%s)" % e)
    e = by["unknown model"]["error"]
    check(e and e["status"] == 404 and e["code"] == "model_not_found", "unknown model: 404 model_not_found (%s)" % e)
    # n choices share the prompt through the GPU cache (design 4's
    # branching): on a prompt never seen, the first computes it and the
    # other two resume from its checkpoint.
    fresh = {"messages": [{"role": "user", "content": "A prompt seen once: %f" % time.time()}],
             "n": 3, "max_tokens": 4, "temperature": 0.5, "seed": 1}
    w = raw(base, "/v1/chat/completions", fresh)
    pt = w["usage"]["prompt_tokens"]
    check(w["flare"]["prefill_tokens"] == pt and w["flare"]["reused_gpu_tokens"] == 2 * pt,
          "n 3: the prompt computed once, reused twice (%s, %d prompt tokens)" % (w["flare"], pt))
    e = by["wrong key"]["error"]
    check(e and e["status"] == 401 and e["code"] == "invalid_api_key", "wrong key: 401 invalid_api_key (%s)" % e)
finally:
    stop_server(proc, "flare")


def png_url(w, h):
    """A data: URL of an RGB PNG test pattern."""
    rows = b"".join(b"\0" + bytes((x * 9 + y * 5 + c * 70) % 256 for x in range(w) for c in range(3))
                    for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(data).decode()


# Images (issue 20): the client's image_url parts on a vision core, the
# same request sent raw answering the same, and a URL never fetched.
proc, base = start(os.path.join(src, "cores", "vision-small.core"))
try:
    r = subprocess.run(["node", os.path.join(src, "tests", "openai_client.js"), moddir, base + "/v1", KEY,
                        png_url(40, 24), "vision-small"], capture_output=True, text=True, timeout=240)
    if r.returncode != 0:
        sys.exit("the openai client failed on images:\n" + r.stderr + r.stdout[-2000:])
    calls = json.loads(r.stdout)
    by = {c["name"]: c for c in calls}
    for c in calls:
        if "choices" in c:
            compare(base, c)
    w = raw(base, "/v1/chat/completions", by["image chat"]["body"])
    check(w["usage"]["prompt_tokens"] > 40, "image chat: the image's tokens are in the prompt (%s)" % w["usage"])
    check(by["image chat stream"]["choices"][0]["text"] == by["image chat"]["choices"][0]["text"],
          "image chat: streamed as answered")
    e = by["image https"]["error"]
    check(e and e["status"] == 400 and e["param"] == "messages[0].content[0]" and "https" in e["message"],
          "image https: 400 naming messages[0].content[0] (%s)" % e)
finally:
    stop_server(proc, "flare (vision)")
if failures:
    sys.exit("%d failed: %s" % (len(failures), failures))
print("ok")
