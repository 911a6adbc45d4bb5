#!/usr/bin/env python3
"""images.py - what reusing CPU inputs saves a chat with an image, end to
end through `flare run` (design 2.13; docs/inputs.md "Serving").

One server on a vision core (default cores/vision.core: 28 x 28 pixels per
token, up to 1280 tokens an image), host retention on.  For each round a
fresh image (a new pattern, so nothing is cached) is sent:

  cold      turn one: decoded, prepared, its tokens prefilled;
  tensors   the same image after other text: the description and the
            prepared tensors come from memory, the image's tokens are
            prefilled again (no checkpoint covers them);
  covered   turn two of the first conversation: description from memory,
            no tensors at all, the checkpoint past the image reused;
  restart   after a restart on the same directory, the same image after
            yet other text: description and tensors from the .input files.

Each is the request's wall time (non-streamed, max_tokens 1) as the client
sees it, median of the rounds, and its ratio against cold in the same
run.  Prints RESULT lines:

  RESULT images_<case>_ms <value> ms
  RESULT images_<case>_vs_cold <ratio> x

Usage: bench/images.py [--flare build/flare] [--core cores/vision.core]
                       [--size 896x672] [--rounds 5]
"""
import argparse
import base64
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zlib

src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, install_cleanup  # noqa: E402


def png(w, h, seed):
    row = lambda y: b"\0" + bytes(((x * 7 + y * 13 + seed * 31 + c * 50) % 256)
                                  for x in range(w) for c in range(3))
    raw = b"".join(row(y) for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))


def msgs(system, url, more=None):
    m = [{"role": "system", "content": system},
         {"role": "user", "content": [{"type": "text", "text": "Describe this picture."},
                                      {"type": "image_url", "image_url": {"url": url}}]}]
    return m + (more or [])


def timed(srv, messages):
    t0 = time.perf_counter()
    r = srv.chat(messages, max_tokens=1, temperature=0)
    return (time.perf_counter() - t0) * 1e3, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--flare", default=os.path.join(src, "build", "flare"))
    ap.add_argument("--core", default=os.path.join(src, "cores", "vision.core"))
    ap.add_argument("--size", default="896x672")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    w, h = (int(v) for v in a.size.split("x"))
    install_cleanup()
    tmp = tempfile.mkdtemp(prefix="bench-images-")
    args = ["--prefix-cache-memory", "512MiB", "--prefix-cache-disk", os.path.join(tmp, "cache"),
            "--prefix-cache-disk-limit", "8GiB", "--max-active", "2", "--gpu-cache", "1GiB"]
    cases = {k: [] for k in ("cold", "tensors", "covered", "restart")}
    urls = ["data:image/png;base64," + base64.b64encode(png(w, h, 100 + i)).decode()
            for i in range(a.rounds)]
    try:
        srv = Flare(a.flare, args, core=a.core, name="bench-images").start()
        try:
            warm = "data:image/png;base64," + base64.b64encode(png(w, h, 99)).decode()
            timed(srv, msgs("warm-up", warm))  # not counted: first-call costs
            for i, url in enumerate(urls):
                sys_i = f"Round {i}."
                ms, r = timed(srv, msgs(sys_i, url))
                cases["cold"].append(ms)
                ms, _ = timed(srv, msgs(sys_i + " Other text.", url))
                cases["tensors"].append(ms)
                more = [{"role": "assistant", "content": r["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "And?"}]
                ms, _ = timed(srv, msgs(sys_i, url, more))
                cases["covered"].append(ms)
            tokens = r["usage"]["prompt_tokens"]
            m = srv.metrics()
            print(f"# {a.size} image, {tokens} prompt tokens; decodes "
                  f"{m.get('flare_input_decodes_total'):.0f}, preparations "
                  f"{m.get('flare_input_preparations_total'):.0f}, input hits dram "
                  f"{m.get('flare_input_cache_hits_total', tier='dram'):.0f}")
        finally:
            srv.stop()
        srv = Flare(a.flare, args, core=a.core, name="bench-images-again").start()
        try:
            for i, url in enumerate(urls):
                ms, _ = timed(srv, msgs(f"Round {i}. Yet other text.", url))
                cases["restart"].append(ms)
            m = srv.metrics()
            print(f"# after the restart: decodes {m.get('flare_input_decodes_total'):.0f}, "
                  f"input hits nvme {m.get('flare_input_cache_hits_total', tier='nvme'):.0f}")
        finally:
            srv.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    cold = statistics.median(cases["cold"])
    for k, v in cases.items():
        med = statistics.median(v)
        print(f"RESULT images_{k}_ms {med:.2f} ms")
        if k != "cold":
            print(f"RESULT images_{k}_vs_cold {med / cold:.3f} x")


main()
