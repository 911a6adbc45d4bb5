#!/usr/bin/env python3
"""Speculative decoding over HTTP (issue 19): `flare run --speculate copy`
and `--speculate learned` answer exactly as `--speculate off` does at
temperature 0 -- text, finish reasons, stop sequences, logprobs, n
choices, streamed or not, chat and completions -- and copy does at a
temperature with a seed too; learned sampling keeps every choice's shape.
The "flare" object reports speculation (rounds, proposed, accepted): none
when off, some when on.  --draft-tokens bounds the proposals per round.
/metrics counts the rounds of the server's mode and times them.

Servers are started by this test on loopback ports it reads back and
stopped by it."""
import os
import sys

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import Flare, install_cleanup  # noqa: E402

install_cleanup()
binary = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
FOX = "the quick brown fox jumps over the lazy dog. "
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def strip(resp):
    """What a client sees, without the id, time and the flare object."""
    return {"choices": resp["choices"], "usage": resp["usage"]}


def stream_text(s):
    """The streamed text and finish reason of each choice."""
    out = {}
    for _, ev in s.events:
        for c in ev.get("choices", []):
            i = c["index"]
            t, f = out.get(i, ("", None))
            piece = c.get("text")
            if piece is None:
                piece = (c.get("delta") or {}).get("content") or ""
            out[i] = (t + piece, c.get("finish_reason") or f)
    return out


REQUESTS = [
    ("/v1/completions", {"prompt": FOX * 4 + "the quick", "max_tokens": 80}),
    ("/v1/completions", {"prompt": FOX * 4, "max_tokens": 60, "stop": ["dog", "zz"]}),
    ("/v1/completions", {"prompt": [FOX * 2 + "the", "Once upon a time"], "max_tokens": 40,
                         "logprobs": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Tell me about the tides."}],
                              "max_tokens": 48, "logprobs": True, "top_logprobs": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": FOX * 3}],
                              "max_tokens": 48, "n": 2, "stop": ["o", "\n"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello"}],
                              "max_tokens": 30, "ignore_eos": True}),
]


def run_all(srv, temperature=0, seed=None):
    out = []
    for path, body in REQUESTS:
        b = dict(body, temperature=temperature)
        if seed is not None:
            b["seed"] = seed
        out.append(srv.post(path, b))
    return out


def spec(resp):
    return resp["flare"]["speculation"]


def main():
    off = Flare(binary, ["--speculate", "off"], name="off").start()
    cp = Flare(binary, ["--speculate", "copy", "--draft-tokens", "6"], name="copy").start()
    ln = Flare(binary, ["--speculate", "learned"], name="learned").start()
    try:
        ref = run_all(off)
        for srv, name in ((cp, "copy"), (ln, "learned")):
            got = run_all(srv)
            for i, (r, g) in enumerate(zip(ref, got)):
                check(strip(r) == strip(g), f"{name}: request {i} answered otherwise than off:\n"
                      f"  off: {strip(r)}\n  {name}: {strip(g)}")
                check(spec(r) == {"rounds": 0, "proposed": 0, "accepted": 0},
                      f"off: request {i} reports speculation {spec(r)}")
                s = spec(g)
                check(s["accepted"] <= s["proposed"], f"{name}: request {i}: {s}")
            s = [spec(g) for g in got]
            check(sum(x["rounds"] for x in s) > 0 and sum(x["accepted"] for x in s) > 0,
                  f"{name}: no round accepted anything: {s}")
            # The same streamed.
            path, body = REQUESTS[4]
            st = srv.stream(path, dict(body, temperature=0))
            want = {c["index"]: (c["message"]["content"], c["finish_reason"]) for c in ref[4]["choices"]}
            check(stream_text(st) == want, f"{name}: streamed {stream_text(st)}, off answered {want}")
            path, body = REQUESTS[0]
            st = srv.stream(path, dict(body, temperature=0))
            want = {0: (ref[0]["choices"][0]["text"], ref[0]["choices"][0]["finish_reason"])}
            check(stream_text(st) == want, f"{name}: streamed completion differs")

        # A temperature with a seed: copy's acceptance is the ordinary draw,
        # so it answers as off does; learned samples the same distribution.
        ref = run_all(off, temperature=0.8, seed=7)
        got = run_all(cp, temperature=0.8, seed=7)
        for i, (r, g) in enumerate(zip(ref, got)):
            check(strip(r) == strip(g), f"copy at 0.8: request {i} answered otherwise than off")
        got = run_all(ln, temperature=0.8, seed=7)
        for i, (r, g) in enumerate(zip(ref, got)):
            check(len(g["choices"]) == len(r["choices"]) and
                  all(c["finish_reason"] in ("stop", "length") for c in g["choices"]),
                  f"learned at 0.8: request {i}: {g['choices']}")
            check(g["usage"]["prompt_tokens"] == r["usage"]["prompt_tokens"],
                  f"learned at 0.8: request {i}: usage {g['usage']}")

        # /metrics: the server's mode counts and times its rounds.
        m = cp.metrics()
        check(m.get("flare_spec_rounds_total", mode="copy") > 0, "copy: no rounds in /metrics")
        check(m.get("flare_spec_rounds_total", mode="learned") == 0, "copy: learned rounds counted")
        check(m.get("flare_spec_round_time_seconds_count", mode="copy") ==
              m.get("flare_spec_rounds_total", mode="copy"), "copy: rounds not all timed")
        rate = m.get("flare_spec_acceptance_rate", mode="copy")
        check(0 < rate <= 1, f"copy: acceptance rate {rate}")
        check(m.get("flare_spec_tokens_per_round", mode="copy") > 1, "copy: one token per round")
        m = off.metrics()
        check(m.get("flare_spec_rounds_total", mode="copy") == 0 and
              m.get("flare_spec_rounds_total", mode="learned") == 0, "off: rounds counted")
    finally:
        for s in (off, cp, ln):
            s.stop()

    # --draft-tokens bounds what a round proposes, and changes no token.
    answers = {}
    for k in (1, 8):
        with Flare(binary, ["--speculate", "copy", "--draft-tokens", str(k)], name=f"draft{k}") as srv:
            r = srv.complete(FOX * 4 + "the quick", max_tokens=120)
            s = spec(r)
            check(s["proposed"] <= k * s["rounds"], f"--draft-tokens {k}: {s}")
            answers[k] = (r["choices"], s)
    check(answers[1][0] == answers[8][0], "--draft-tokens changed the answer")
    s1, s8 = answers[1][1], answers[8][1]
    check(s8["rounds"] < s1["rounds"] and s8["proposed"] > s1["proposed"],
          f"--draft-tokens 8 against 1: {s8} and {s1}")
    print(f"--draft-tokens 1: {s1}; 8: {s8}")
    if failures:
        sys.exit(f"{len(failures)} checks failed")
    print("ok")


main()
