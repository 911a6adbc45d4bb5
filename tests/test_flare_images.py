#!/usr/bin/env python3
"""Images through `flare run` (issue 20; design 2.13; docs/inputs.md): a
chat with a PNG image part is answered; the next turn of the conversation
with the same image is answered from a reused checkpoint with nothing
decoded or prepared again (an input cache hit, the image covered); the
same image after other text is a tensor hit; a JPEG part works; bad
images, decompression bombs, other URL schemes, a media type that lies
and more images than --max-images are refused with 400 naming the part; a text-only
core refuses any image part; after a restart on the same directory the
.input records are found on disk (disk hits, nothing decoded) and
`flare records ls/verify` list and verify them; `--speculate copy` answers
an image chat as `--speculate off` does.

Servers are started by this test on loopback ports it reads back and
stopped by it; the directory is the test's own."""
import base64
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, FlareError, install_cleanup  # noqa: E402

install_cleanup()
binary = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
core = os.path.join(src, "cores", "vision-small.core")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def png(w, h, seed, declared=None):
    """An RGB PNG of a pattern; declared=(w, h) writes another size in
    IHDR (a bomb claims more pixels than it holds)."""
    rows = b"".join(b"\0" + bytes(((x * 7 + y * 13 + seed * 31 + c * 50) % 256)
                                  for x in range(w) for c in range(3)) for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    dw, dh = declared or (w, h)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", dw, dh, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def url(data, media="image/png"):
    return f"data:{media};base64," + base64.b64encode(data).decode()


def user(text, image_url, after=""):
    parts = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": image_url}}]
    if after:
        parts.append({"type": "text", "text": after})
    return {"role": "user", "content": parts}


def status_of(srv, body):
    r = srv.request("POST", "/v1/chat/completions", body)
    try:
        return r.status, json.loads(r.body)
    except ValueError:
        return r.status, {}


def refused(srv, messages, param, words, what):
    st, body = status_of(srv, {"messages": messages, "max_tokens": 4})
    err = body.get("error", {})
    msg = err.get("message", "")
    check(st == 400, f"{what}: HTTP {st} {body}")
    check(err.get("param") == param, f"{what}: param {err.get('param')!r}, wanted {param!r}")
    check(all(w in msg for w in words), f"{what}: message {msg!r} lacks {words}")


def inputs(srv):
    m = srv.metrics()
    return {
        "lookups": m.get("flare_input_cache_lookups_total"),
        "dram": m.get("flare_input_cache_hits_total", tier="dram"),
        "nvme": m.get("flare_input_cache_hits_total", tier="nvme"),
        "decodes": m.get("flare_input_decodes_total"),
        "preparations": m.get("flare_input_preparations_total"),
        "covered": m.get("flare_input_covered_total"),
        "bytes_dram": m.get("flare_input_cache_bytes", tier="dram"),
        "bytes_nvme": m.get("flare_input_cache_bytes", tier="nvme"),
    }


def reply(resp):
    return resp["choices"][0]["message"]["content"]


def main():
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp(prefix="test_flare_images-")
    cache = os.path.join(tmp, "images-cache")
    args = ["--prefix-cache-memory", "16MiB", "--prefix-cache-disk", cache,
            "--prefix-cache-disk-limit", "64MiB", "--prefix-cache-fetch", "always",
            "--max-images", "4"]
    img = png(40, 24, 5)
    sys_msg = {"role": "system", "content": "Be brief."}
    turn1 = [sys_msg, user("What is this?", url(img))]

    srv = Flare(binary, args, core=core, name="vision").start()
    try:
        a = srv.chat(turn1, max_tokens=12, ignore_eos=True)
        check(a["choices"][0]["finish_reason"] == "length", f"turn 1: {a['choices'][0]}")
        s1 = inputs(srv)
        check(s1["decodes"] == 1 and s1["preparations"] == 1, f"turn 1: {s1}")
        check(s1["bytes_dram"] > 0, f"turn 1: nothing in the memory input tier: {s1}")

        # Turn two: the same image in the same place, a checkpoint after it.
        turn2 = turn1 + [{"role": "assistant", "content": reply(a)},
                         {"role": "user", "content": "And the colours?"}]
        b = srv.chat(turn2, max_tokens=8, ignore_eos=True)
        s2 = inputs(srv)
        check(s2["decodes"] == 1 and s2["preparations"] == 1,
              f"turn 2 decoded or prepared again: {s2}")
        check(s2["dram"] == s1["dram"] + 1 and s2["covered"] >= 1, f"turn 2: {s2}")
        check(b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, f"turn 2: {b['usage']}")

        # Other text before the same image: a tensor hit, not prepared.
        c = srv.chat([{"role": "system", "content": "Be kind."}, user("And this?", url(img))],
                     max_tokens=8)
        s3 = inputs(srv)
        check(s3["preparations"] == 1 and s3["decodes"] == 1, f"other text: {s3}")
        check(c["choices"][0]["finish_reason"] in ("stop", "length"), f"other text: {c}")

        # The exposition, image metrics included, passes promtool.
        if shutil.which("promtool"):
            pc = subprocess.run(["promtool", "check", "metrics"], input=srv.get("/metrics"),
                                capture_output=True, text=True, timeout=60)
            check(pc.returncode == 0, f"promtool check metrics: {pc.stdout} {pc.stderr}")
        else:
            print("promtool not installed: the exposition is not linted here")

        # A JPEG, and an image between two text parts.
        with open(os.path.join(src, "fuzz", "corpus", "image", "rgb.jpg"), "rb") as f:
            jpg = f.read()
        d = srv.chat([user("A photo:", url(jpg, "image/jpeg"), "Describe it.")], max_tokens=6)
        check(d["choices"][0]["finish_reason"] in ("stop", "length"), f"jpeg: {d}")

        # Refusals, each naming the part and the reason.
        p = "messages[0].content[1]"
        refused(srv, [user("x", "https://example.com/cat.png")], p, ["https", "data:"],
                "an https URL")
        refused(srv, [user("x", "file:///etc/passwd")], p, ["file"], "a file URL")
        refused(srv, [user("x", "data:image/gif;base64,R0lGODlh")], p, ["image/gif"], "a GIF")
        refused(srv, [user("x", "data:image/png;base64,@@@@")], p, ["base64"], "bad base64")
        refused(srv, [user("x", url(b"not an image at all"))], p, ["PNG"], "not an image")
        refused(srv, [user("x", url(png(4, 4, 1, declared=(60000, 60000))))], p, ["60000"],
                "a decompression bomb")
        refused(srv, [user("x", url(png(4, 4, 1, declared=(5000, 5000))))], p, ["5000"],
                "an oversized image")
        refused(srv, [user("x", url(img, "image/jpeg"))], p, ["PNG", "image/jpeg"],
                "a media type that lies")
        many = [{"type": "image_url", "image_url": {"url": url(img)}}] * 5
        refused(srv, [{"role": "user", "content": many}], "messages[0].content[4]", ["5", "4"],
                "5 images over --max-images 4")
        refused(srv, [{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}],
                "messages[0].content[0]", ["image_url"], "image_url not an object")
        # A valid header over data that does not decode: found by the
        # preparation worker, still a 400.
        broken = bytearray(png(16, 16, 9))
        for i in range(45, len(broken) - 16):
            broken[i] ^= 0x5a
        st, body = status_of(srv, {"messages": [user("x", url(bytes(broken)))], "max_tokens": 2})
        check(st == 400 and "does not decode" in body.get("error", {}).get("message", ""),
              f"corrupt image data: HTTP {st} {body}")
        # Streamed, the same image fails its stream with a 400-class error.
        try:
            srv.stream("/v1/chat/completions",
                       {"messages": [user("y", url(bytes(broken)))], "max_tokens": 2})
            check(False, "a streamed corrupt image was answered")
        except FlareError as e:
            check("does not decode" in str(e) and ("400" in str(e) or "invalid_request" in str(e)),
                  f"streamed corrupt image: {e}")
        st, _ = status_of(srv, {"messages": turn1, "max_tokens": 2})
        check(st == 200, f"after the refusals: HTTP {st}")
    finally:
        srv.stop()

    # A restart on the same directory: the records are on disk.
    srv = Flare(binary, args, core=core, name="vision-again").start()
    try:
        e = srv.chat([{"role": "system", "content": "Be quick."}, user("What is this?", url(img))],
                     max_tokens=6)
        s = inputs(srv)
        check(s["decodes"] == 0 and s["preparations"] == 0 and s["nvme"] == 2,
              f"restart: {s}")
        check(s["bytes_nvme"] > 0, f"restart: {s}")
        check(e["choices"][0]["finish_reason"] in ("stop", "length"), f"restart: {e}")
    finally:
        srv.stop()

    # flare records sees the .input files.
    dirs = [os.path.join(cache, d) for d in os.listdir(cache)]
    ns = [d for d in dirs if os.path.isdir(d)][0]
    n_inputs = len([f for f in os.listdir(ns) if f.endswith(".input")])
    check(n_inputs >= 4, f"{n_inputs} .input files in {ns}")
    ls = subprocess.run([binary, "records", "ls", ns], capture_output=True, text=True)
    check(ls.returncode == 0, f"records ls: {ls.returncode} {ls.stderr}")
    check(ls.stdout.count(".input") == n_inputs, f"records ls lists {ls.stdout.count('.input')} "
          f"of {n_inputs} .input files:\n{ls.stdout}")
    vf = subprocess.run([binary, "records", "verify", ns], capture_output=True, text=True)
    check(vf.returncode == 0, f"records verify: {vf.returncode} {vf.stdout} {vf.stderr}")
    prep = sorted(f for f in os.listdir(ns) if f.startswith("prep-"))[0]
    with open(os.path.join(ns, prep), "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x20]))
    vf = subprocess.run([binary, "records", "verify", ns], capture_output=True, text=True)
    check(vf.returncode != 0 and prep in vf.stdout + vf.stderr,
          f"records verify of a corrupted {prep}: {vf.returncode} {vf.stdout} {vf.stderr}")

    # Speculative decoding over a prompt with an image answers as off does
    # (image positions never become draft proposals).
    srv = Flare(binary, ["--speculate", "copy"], core=core, name="vision-copy").start()
    try:
        g = srv.chat(turn1, max_tokens=12, ignore_eos=True)
        check(reply(g) == reply(a), f"--speculate copy: {reply(g)!r}, off: {reply(a)!r}")
        check(g["flare"]["speculation"]["rounds"] > 0, f"--speculate copy: {g['flare']}")
    finally:
        srv.stop()

    # A text-only core refuses image parts.
    srv = Flare(binary, [], name="text").start()
    try:
        refused(srv, [user("x", url(img))], "messages[0].content[1]", ["takes no images"],
                "a text-only core")
    finally:
        srv.stop()

    shutil.rmtree(cache, ignore_errors=True)
    if not os.environ.get("TEST_TMPDIR"):
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("ok")


main()
