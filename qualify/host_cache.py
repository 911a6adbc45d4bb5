#!/usr/bin/env python3
"""host_cache.py - qualification scenarios of the host prefix cache
(design section 4, implementation steps 11 and 12).

Each scenario launches `flare run` (with and without a host store) through
qualify/flare.py, drives it over HTTP like a client would, and reports PASS,
FAIL or SKIP with the checks it made.  Every scenario runs with every store
that supports it:

  gpu-only      GPU-cache reuse with offload disabled (no store).
  memory-hit    Memory hit after GPU eviction (memory, disk, composite).
  restart       Disk hit after a server restart (disk, composite).
  branching     Two continuations of one evicted prefix admitted together
                share one inbound ticket (memory, disk, composite).
  namespaces    Ordinary and speculative records never meet; compatible
                flags keep their hits; another layout misses (disk, composite).
  corruption    A flipped byte in a record file (header, page, row) gives a
                miss or a failed restore, a recompute and the right answer
                (disk, composite).
  pool          The pool (design 2.15) over each local-tier combination
                (none: pool only; memory, disk, composite): a neighbour's
                GPU copy, then the arena's after the neighbour stopped.
  fetch-choice  The fetch policy (--prefix-cache-fetch auto) picks the faster
                of restoring and recomputing, timed against the same
                requests with always and never, for a short and a long
                prefix (memory, disk; the realistic Qwen TP1 core only: the
                tiny core's restores and recomputes both take less than
                HTTP's noise).

The conversation (Conversation, turn1_and_continue).  Turn 1 is a chat
request; its terminal checkpoint T1 holds prompt + completion - 1 tokens
(the last sampled token is not consumed).  The engine defers terminals
until a request resumes at exactly them (design 2.2), so a "continue"
request follows: /v1/completions with turn 1's transcript up to T1 as token
ids and max_tokens 1 (the client continuing turn 1's answer); it resumes
from the GPU cache with no prefill and offers T1 to the store.  Distinct
filler prompts (3 x max_active + 4, one GPU row each) then evict it from the
GPU.  Turn 2 (user 1, the reply, a new user message) must reuse exactly T1
from the host: reused_host_tokens == reused_tokens == cached_tokens == T1,
reused_gpu_tokens == 0, source memory (disk for the disk store),
prefill_tokens == n2 - T1, prefill_launches == the chunks of those tokens
(256-token chunks cut at every message end and the prompt end), one fetch
and one host hit in /metrics, and the same answer as the same conversation
on a server without a store.  Without the continue request (plain
multi-turn, turn 3) the deepest host record is turn 2's prompt checkpoint:
turn 2's terminal is never offered.

Correctness is verbatim: our synthetic model is deterministic, so every
answer at temperature 0 must equal, token for token, the answer of a server
without a host store that computed the same prompt cold (design 4 uses a
nine-fact retrieval check because a real model's sampled continuations are
compared by their answers; ours are compared exactly).

    python3 qualify/host_cache.py [--flare build/flare] [--quick | --full]
        [--stores memory,disk,composite] [--scenarios memory-hit,...]
        [--cores tiny,qwen-tp1,...] [-v]

--quick (the default; what `make check` runs through tests/test_qualify.py)
uses the built-in tiny core at small sizes; --full (`make qualify`) adds the
realistic Qwen TP1 core (a 792 KiB page record, a 104 MiB row) and the small
cores of the other model families.  Exit status: 0 when nothing failed
(skips allowed; each prints why), 1 when a scenario failed, 2 for bad usage.
Scenarios that need the disk store skip in a build without one.  Every
scenario but fetch-choice runs its stores with --prefix-cache-fetch always:
they assert restore paths, which the fetch policy (design 2.10) would
rightly skip where recomputing is faster (this fast synthetic model against
this disk); fetch-choice checks the policy's own choice.
"""

import argparse
import os
import random
import re
import struct
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flare import (Flare, FlareError, TempDir, chat_tokens, core_ranks, install_cleanup,  # noqa: E402
                   find_flare, geometry, gpu_cache_bytes, message_ends, repo_root)

# The engine's prefill chunk (hel_engine_config.chunk_tokens, default 256;
# flare run does not change it).  A chunk never crosses a checkpoint
# capture point (message ends and the prompt end).
CHUNK = 256

ALPHABET = "abcdefghijklmnopqrstuvwxyz      ABCDEFGHIJ.,?0123456789"


class Skip(Exception):
    pass


class Fail(Exception):
    pass


def text(rng, n):
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def expected_launches(tokens, start):
    """Prefill chunks for computing tokens[start:]: split at every capture
    point after start (message ends and the prompt end), each piece in
    chunks of CHUNK tokens."""
    cuts = sorted({c for c in message_ends(tokens) if c > start} | {len(tokens)})
    n, pos = 0, start
    for c in cuts:
        n += -(-(c - pos) // CHUNK)
        pos = c
    return n


# ---- results -----------------------------------------------------------------

class Result:
    def __init__(self, scenario, store, core):
        self.scenario, self.store, self.core = scenario, store, core
        self.status = "PASS"
        self.lines = []
        self.seconds = 0.0

    def check(self, cond, what, detail=""):
        mark = "ok  " if cond else "FAIL"
        self.lines.append(f"{mark} {what}" + (f": {detail}" if detail else ""))
        if not cond:
            self.status = "FAIL"
        return cond

    def require(self, cond, what, detail=""):
        """A check the rest of the scenario depends on."""
        if not self.check(cond, what, detail):
            raise Fail(what)

    def note(self, s):
        self.lines.append(f"     {s}")

    def name(self):
        return f"{self.scenario} [{self.store}, {self.core}]"


# ---- cores and sizes -----------------------------------------------------------

class Core:
    """A core to run scenarios on, with sizes chosen for it.  GPU cache and
    memory budgets are computed from the core's own page and row sizes,
    which `flare run --gpu-cache 1` reports in its refusal."""

    def __init__(self, name, path, user1, user2, filler, gpu_pages, max_active=4,
                 max_tokens=48, modes=("ordinary",)):
        self.name, self.path = name, path
        self.user1, self.user2, self.filler = user1, user2, filler
        self.gpu_pages, self.max_active, self.max_tokens = gpu_pages, max_active, max_tokens
        self.modes = modes
        self.geo = {}

    def geometry(self, flare_bin, mode="ordinary"):
        """(page bytes, row bytes) on the GPU for a state mode."""
        if mode not in self.geo:
            self.geo[mode] = geometry(flare_bin, self.path, self.max_active, mode)
        return self.geo[mode]

    def ranks(self):
        return core_ranks(self.path)

    def slot_bytes(self, flare_bin, mode="ordinary"):
        """Bytes of one host slot (a page record, planes padded to 4 KiB),
        from /metrics of a server started for the purpose."""
        key = ("slot", mode)
        if key not in self.geo:
            args = self.args(flare_bin, mode, pages=2 * self.max_active) + [
                "--prefix-cache-memory", "1MiB"]
            with Flare(flare_bin, args, core=self.path, name="probe") as srv:
                self.geo[key] = int(srv.metrics().value("flare_host_cache_slot_bytes"))
        return self.geo[key]

    def gpu_cache(self, flare_bin, mode="ordinary", pages=None):
        """Bytes for `pages` pages besides the minimum rows, 3 x max_active
        (rows are set through max_active)."""
        pb, rb = self.geometry(flare_bin, mode)
        return gpu_cache_bytes(pb, rb, self.max_active, pages or self.gpu_pages)

    def gpu_rows(self):
        return 3 * self.max_active

    def args(self, flare_bin, mode="ordinary", pages=None):
        a = ["--gpu-cache", str(self.gpu_cache(flare_bin, mode, pages)),
             "--max-active", str(self.max_active)]
        if mode != "ordinary":
            a += ["--speculate", mode]
        return a


def core_table(root):
    c = lambda f: os.path.join(root, "cores", f)  # noqa: E731
    spec = ("ordinary", "copy", "learned")
    return {
        "tiny": Core("tiny", None, 300, 100, 300, gpu_pages=24, modes=spec),
        "qwen-tp1-small": Core("qwen-tp1-small", c("qwen-tp1-small.core"), 300, 100, 300,
                               gpu_pages=24, modes=spec),
        "qwen-tp2-small": Core("qwen-tp2-small", c("qwen-tp2-small.core"), 300, 100, 300,
                               gpu_pages=24, modes=spec),
        "deepseek-small": Core("deepseek-small", c("deepseek-small.core"), 300, 100, 300,
                               gpu_pages=24, modes=spec),
        "hybrid-small": Core("hybrid-small", c("hybrid-small.core"), 300, 100, 300, gpu_pages=24),
        # Realistic bytes: a 104 MiB row, so the conversation is long, as
        # the prefixes worth offloading are.  From disk, recomputing it is
        # faster on this machine (fetch-choice measures both).
        "qwen-tp1": Core("qwen-tp1", c("qwen-tp1.core"), 4000, 200, 300, gpu_pages=160,
                         modes=spec),
    }


# ---- the scenario context ----------------------------------------------------------

class Ctx:
    def __init__(self, flare_bin, quick, verbose, tmp):
        self.flare = flare_bin
        self.quick = quick
        self.verbose = verbose
        self.tmp = tmp
        self.refs = {}
        self._ref_server = {}
        self.disk_available = None
        self.counter = 0

    def log(self, s):
        if self.verbose:
            print("    " + s, flush=True)

    def server(self, core, args=(), name="flare"):
        return Flare(self.flare, list(args), core=core.path, name=name,
                     log=self.log if self.verbose else None)

    def dir(self, what):
        self.counter += 1
        p = os.path.join(self.tmp, f"{what}-{self.counter}")
        os.makedirs(p)
        return p

    # The reference: a server without a store answering every request cold
    # (a fresh cache salt each time, so nothing is ever reused).
    def reference(self, core, kind, body):
        key = (core.name, kind, repr(sorted(body.items())))
        if key in self.refs:
            return self.refs[key]
        srv = self._ref_server.get(core.name)
        if srv is None:
            srv = self.server(core, core.args(self.flare, pages=None), name="reference").start()
            self._ref_server[core.name] = srv
        self.counter += 1
        b = dict(body, cache_salt=f"reference-{self.counter}")
        path = "/v1/completions" if kind == "completions" else "/v1/chat/completions"
        r = srv.post(path, b)
        if r["flare"]["reused_tokens"] != 0:
            raise FlareError(f"the reference reused tokens: {r['flare']}")
        self.refs[key] = r
        return r

    def need(self, core, store):
        """Skip at once when this build has no disk store."""
        if store not in ("disk", "composite"):
            return
        if self.disk_available is None:
            d = self.dir("probe")
            args = core.args(self.flare, pages=2 * core.max_active) + [
                "--prefix-cache-memory", "1MiB", "--prefix-cache-disk", d]
            with self.server(core, args, name="probe") as srv:
                self.disk_available = (srv.store() == "composite", srv.disk_note())
        if not self.disk_available[0]:
            raise Skip(f"no disk store in this build: {self.disk_available[1]}")

    def close(self):
        for srv in self._ref_server.values():
            srv.stop()
        self._ref_server = {}


def answer(r):
    """What must match between a response and its reference."""
    ch = r["choices"][0]
    content = ch["text"] if "text" in ch else ch["message"]["content"]
    return (content, ch["finish_reason"], r["usage"]["completion_tokens"])


def same_as_reference(res, ctx, core, kind, body, r, what):
    ref = ctx.reference(core, kind, body)
    a, b = answer(r), answer(ref)
    return res.check(a == b, f"{what}: tokens identical to a cold no-offload run",
                     f"{a[2]} tokens, finish {a[1]}" if a == b
                     else f"got {a!r}, reference {b!r}")


# ---- stores -----------------------------------------------------------------------

def store_args(ctx, store, core, disk_dir=None, memory=None, drain=False, fetch="always"):
    """Flags selecting `store`; memory sized in bytes (an int) or a size;
    restoring every host hit unless `fetch` says otherwise."""
    if store == "none":
        return []
    a = ["--prefix-cache-fetch", fetch]
    if store in ("memory", "composite"):
        a += ["--prefix-cache-memory", str(memory)]
    if store in ("disk", "composite"):
        a += ["--prefix-cache-disk", disk_dir, "--prefix-cache-disk-limit", "4GiB"]
        if drain:
            a.append("--prefix-cache-drain-on-shutdown")
    return a


def check_store(res, srv, store):
    got = srv.store()
    if got == store:
        return
    note = srv.disk_note()
    if store in ("disk", "composite") and "not available" in note:
        raise Skip(f"the disk store is not available in this build ({note})")
    res.require(False, f"store {store} selected", f"startup says '{got}'"
                + (f"; no disk store: {note}" if note else ""))


def memory_for(ctx, core, mode, token_counts):
    """Warm memory bytes that hold complete records (the whole page chain
    plus the row) of the given token counts, with a quarter more to
    spare.  A slot is one page record; a row is cut into pieces of each
    rank's share of a slot (design 2.5)."""
    pb, rb = core.geometry(ctx.flare, mode)
    slot = core.slot_bytes(ctx.flare, mode)
    rows = -(-rb // (slot // core.ranks())) + 1
    slots = sum(-(-t // 64) + 1 + rows for t in token_counts)
    return int(slots * slot * 1.25) + (1 << 20)


def scanned(srv):
    for line in srv.startup:
        m = re.search(r"(\d+) records scanned", line)
        if m:
            return int(m.group(1))
    return None


# ---- a conversation ---------------------------------------------------------------

class Conversation:
    """Turn 1 (a user message and the engine's reply), the terminal T1 of
    turn 1 (prompt + completion - 1 tokens: the last sampled token is not
    consumed), and follow-up user messages.

    The reply must come back byte-exact through JSON for the follow-up's
    prompt to begin with T1's tokens: a reply with bytes that are not
    UTF-8 would be turned into U+FFFD.  choose() picks, deterministically,
    the first seed whose reply is clean."""

    def __init__(self, ctx, core, seed):
        self.ctx, self.core = ctx, core
        for attempt in range(40):
            rng = random.Random(seed * 1000 + attempt)
            self.user1 = text(rng, core.user1)
            self.msgs1 = [{"role": "user", "content": self.user1}]
            r = ctx.reference(core, "chat", self.body1())
            reply = r["choices"][0]["message"]["content"]
            c1 = r["usage"]["completion_tokens"]
            stop = r["choices"][0]["finish_reason"] == "stop"
            raw = reply.encode()
            if "\ufffd" not in reply and len(raw) == c1 - (1 if stop else 0) and c1 >= 4:
                break
        else:
            raise FlareError("no clean turn-1 reply in 40 seeds")
        self.seed = seed * 1000 + attempt
        self.rng = rng
        self.reply1 = reply
        self.n1 = r["usage"]["prompt_tokens"]
        self.c1 = c1
        self.t1 = self.n1 + c1 - 1
        self.prompt1 = chat_tokens(self.msgs1)
        assert len(self.prompt1) == self.n1
        self.transcript = self.prompt1 + list(raw)
        # The reply's MESSAGE checkpoint in every follow-up.
        self.reply_end = len(self.transcript) + 1

    def body1(self):
        return {"messages": self.msgs1, "max_tokens": self.core.max_tokens, "temperature": 0}

    def continue_body(self):
        """A request resuming exactly at turn 1's terminal: the transcript
        through the reply, less the last token when the reply was cut by
        max_tokens (then T1 ends one token earlier), one new token."""
        return {"prompt": self.transcript[:self.t1], "max_tokens": 1, "temperature": 0}

    def follow_up(self, user2):
        msgs = self.msgs1 + [{"role": "assistant", "content": self.reply1},
                             {"role": "user", "content": user2}]
        body = {"messages": msgs, "max_tokens": self.core.max_tokens, "temperature": 0}
        toks = chat_tokens(msgs)
        assert toks[:self.t1] == self.transcript[:self.t1]
        return body, toks

    def user2(self, tag=0):
        r = random.Random(self.seed * 7 + tag)
        return text(r, self.core.user2)


def fillers(ctx, srv, core, count, seed):
    """Distinct one-message prompts that push older checkpoints out of the
    GPU cache (each publishes its prompt checkpoint).  Each is settled
    before the next: on a busy disk a put behind writes in flight is a
    retry, and a retry is abandoned once its checkpoint leaves the GPU, so
    back-to-back fillers would leave the host tier holding fewer of them
    than the scenarios count on."""
    for i in range(count):
        r = random.Random(seed * 100003 + i)
        srv.chat([{"role": "user", "content": "filler " + text(r, core.filler)}], max_tokens=2)
        # Its checkpoint reaches the store before the next filler: however
        # slow the disk, no publication waits under the copy-out pin bound
        # and is abandoned when the fillers evict it.
        srv.settle()


def filler_count(ctx, core):
    """Enough fillers to cycle every GPU row (each filler's prompt
    checkpoint takes one), so every older checkpoint is evicted or
    compacted (page-only nodes match no lookup).  Turn 2's
    reused_gpu_tokens == 0 confirms it."""
    return core.gpu_rows() + 4


def turn1_and_continue(res, ctx, srv, conv, what="turn 1"):
    """Turn 1, then the continue request that resumes exactly at its
    terminal, which offers the terminal to the store (design 2.2:
    terminals are deferred until a request resumes at exactly them)."""
    r1 = srv.chat(**conv.body1())
    same_as_reference(res, ctx, conv.core, "chat", conv.body1(), r1, what)
    res.check(r1["usage"]["prompt_tokens"] == conv.n1, f"{what}: {conv.n1} prompt tokens")
    rc = srv.complete(**conv.continue_body())
    srv.settle()  # T1 is put to the store before anything else happens
    f = rc["flare"]
    res.check(f["reused_gpu_tokens"] == conv.t1 and f["prefill_tokens"] == 0
              and f["prefill_launches"] == 0,
              f"continue at turn 1's terminal T1 = {conv.t1}: resumed from the GPU cache, "
              "no prefill", f"{f}")
    return r1


# ---- scenarios --------------------------------------------------------------------

def sc_gpu_only(ctx, core, store, res):
    """GPU-cache reuse with offload disabled: each turn of a conversation
    resumes from the previous turn's terminal in the GPU cache."""
    with ctx.server(core, core.args(ctx.flare, pages=256)) as srv:
        res.require(srv.store() == "disabled", "no host store", srv.store())
        rng = random.Random(11)
        msgs = []
        prev_t = 0
        for turn in range(4):
            msgs.append({"role": "user", "content": text(rng, 60 + 40 * turn)})
            body = {"messages": list(msgs), "max_tokens": core.max_tokens, "temperature": 0}
            toks = chat_tokens(msgs)
            r = srv.chat(**body)
            f, u = r["flare"], r["usage"]
            n = u["prompt_tokens"]
            res.check(n == len(toks), f"turn {turn + 1}: prompt tokens = the template's", f"{n}")
            if turn == 0:
                res.check(f["reused_tokens"] == 0 and f["source"] == "none",
                          "turn 1: nothing reused", f"{f}")
            else:
                res.check(f["reused_gpu_tokens"] == prev_t and f["reused_host_tokens"] == 0
                          and f["source"] == "gpu" and u["prompt_tokens_details"]["cached_tokens"]
                          == prev_t,
                          f"turn {turn + 1}: reuses the previous terminal ({prev_t} tokens) "
                          "from the GPU", f"{f}")
                res.check(f["prefill_tokens"] == n - prev_t
                          and f["prefill_launches"] == expected_launches(toks, prev_t),
                          f"turn {turn + 1}: prefill limited to the {n - prev_t} new tokens "
                          f"({expected_launches(toks, prev_t)} launches)", f"{f}")
            same_as_reference(res, ctx, core, "chat", body, r, f"turn {turn + 1}")
            reply = r["choices"][0]["message"]["content"]
            if "\ufffd" in reply:
                res.note("reply not UTF-8; conversation stops here")
                break
            prev_t = n + u["completion_tokens"] - 1
            msgs.append({"role": "assistant", "content": reply})
        m = srv.metrics()
        res.check(m.value("flare_host_cache_enabled") == 0
                  and m.value("flare_host_cache_lookups_total") == 0,
                  "metrics: host cache disabled, no host lookups")
        res.check(m.value("flare_gpu_cache_hits_total") >= 3, "metrics: GPU hits counted",
                  f"{m.value('flare_gpu_cache_hits_total'):.0f}")


def sc_memory_hit(ctx, core, store, res):
    """Memory (host) hit after GPU eviction: turn 1, a continue request at
    turn 1's terminal (which offers it), distinct fillers evict the GPU
    cache, then turn 2 restores the terminal from the host store."""
    ctx.need(core, store)
    conv = Conversation(ctx, core, seed=1)
    d = ctx.dir("memory-hit") if store in ("disk", "composite") else None
    base_args = core.args(ctx.flare)
    # The pool holds more complete checkpoints than the GPU cache: every
    # filler publishes one.
    nfill = filler_count(ctx, core)
    big = conv.t1 + core.user2 + core.max_tokens + 40
    mem = memory_for(ctx, core, "ordinary", [core.filler + 20] * (nfill + 2) + [big] * 4)
    args = base_args + store_args(ctx, store, core, d, mem)
    body2, toks2 = conv.follow_up(conv.user2())
    n2 = len(toks2)

    # The no-offload run of the same conversation.
    with ctx.server(core, base_args, name="no-offload") as srv0:
        turn1_and_continue(res, ctx, srv0, conv, "no-offload turn 1")
        fillers(ctx, srv0, core, nfill, seed=1)
        b2 = srv0.chat(**body2)
        res.check(b2["flare"]["reused_tokens"] < conv.t1,
                  "no-offload turn 2 recomputes turn 1's terminal", f"{b2['flare']}")

    with ctx.server(core, args) as srv:
        check_store(res, srv, store)
        m0 = srv.metrics()
        gpu_rows = m0.value("flare_gpu_cache_rows_capacity")
        res.note(srv.summary().splitlines()[0].replace("flare: ", ""))
        res.note(srv.summary().splitlines()[1].replace("flare: ", ""))
        turn1_and_continue(res, ctx, srv, conv)
        fillers(ctx, srv, core, nfill, seed=1)
        m1 = srv.settle()
        held = m1.sum("flare_host_cache_records")
        res.check(m1.delta(m0, "flare_gpu_cache_evictions_total") > 0,
                  f"{nfill} fillers evicted GPU checkpoints",
                  f"{m1.delta(m0, 'flare_gpu_cache_evictions_total'):.0f} evictions")
        res.note(f"host records after the fillers: {held:.0f} "
                 f"(the GPU cache holds at most {gpu_rows:.0f} checkpoints, one per row)")
        first = m1.value("flare_host_cache_records", tier="nvme" if store == "disk" else "dram")
        res.check(first > gpu_rows, "the first host tier holds more checkpoints than the GPU cache",
                  f"{first:.0f} records > {gpu_rows:.0f} GPU rows")
        r2 = srv.chat(**body2)
        f = r2["flare"]
        m2 = srv.settle()
        src = "disk" if store == "disk" else "memory"
        res.check(f["reused_gpu_tokens"] == 0, "turn 2: nothing left in the GPU cache", f"{f}")
        res.check(f["source"] == src and f["reused_host_tokens"] > 0,
                  f"turn 2: a host hit from {src}", f"{f}")
        res.check(f["reused_host_tokens"] == conv.t1 and f["reused_tokens"] == conv.t1
                  and r2["usage"]["prompt_tokens_details"]["cached_tokens"] == conv.t1,
                  f"turn 2: reused tokens = turn 1's terminal endpoint T1 = {conv.t1}", f"{f}")
        res.check(f["prefill_tokens"] == n2 - conv.t1
                  and f["prefill_launches"] == expected_launches(toks2, conv.t1),
                  f"turn 2: prefill limited to the {n2 - conv.t1} new tokens "
                  f"({expected_launches(toks2, conv.t1)} launches)", f"{f}")
        res.check(m2.delta(m1, "flare_host_cache_fetches_total") == 1
                  and m2.delta(m1, "flare_host_cache_hits_total") == 1
                  and m2.value("flare_host_cache_fetch_declined_total") == 0,
                  "metrics: one restore, one host hit, nothing declined",
                  f"fetches +{m2.delta(m1, 'flare_host_cache_fetches_total'):.0f}, "
                  f"hits +{m2.delta(m1, 'flare_host_cache_hits_total'):.0f}, declined "
                  f"{m2.value('flare_host_cache_fetch_declined_total'):.0f}")
        res.check(m2.delta(m1, "flare_host_cache_reused_tokens_total") == conv.t1,
                  "metrics: host reused tokens += T1")
        res.check(answer(r2) == answer(b2), "turn 2: tokens identical to the no-offload run",
                  f"{answer(r2)!r} vs {answer(b2)!r}" if answer(r2) != answer(b2) else "")
        same_as_reference(res, ctx, core, "chat", body2, r2, "turn 2")

        # Turn 3 of the same conversation, plain multi-turn: turn 2's own
        # terminal is deferred (nothing resumed at it), so after another
        # eviction the deepest host record is turn 2's prompt checkpoint.
        reply2 = r2["choices"][0]["message"]["content"]
        if "\ufffd" not in reply2:
            msgs3 = body2["messages"] + [{"role": "assistant", "content": reply2},
                                         {"role": "user", "content": conv.user2(3)}]
            body3 = dict(body2, messages=msgs3)
            fillers(ctx, srv, core, nfill, seed=3)
            srv.settle()
            r3 = srv.chat(**body3)
            f3 = r3["flare"]
            res.check(f3["reused_host_tokens"] == n2 and f3["reused_gpu_tokens"] == 0,
                      f"turn 3 (no continue request): restores turn 2's prompt checkpoint "
                      f"({n2} tokens); turn 2's terminal was deferred, never offered",
                      f"{f3}")
            same_as_reference(res, ctx, core, "chat", body3, r3, "turn 3")


def sc_restart(ctx, core, store, res):
    """Disk hit after a server restart: same directory, the conversation
    replayed (a chat client sends the whole history) restores turn 1's
    terminal from disk."""
    ctx.need(core, store)
    conv = Conversation(ctx, core, seed=2)
    d = ctx.dir("restart")
    mem = memory_for(ctx, core, "ordinary", [conv.t1 + core.user2 + core.max_tokens + 40] * 4)
    # The composite writes DRAM records to disk under pressure or with the
    # shutdown drain; the drain makes this a warm restart.
    args = core.args(ctx.flare) + store_args(ctx, store, core, d, mem, drain=True)
    body2, toks2 = conv.follow_up(conv.user2())
    n2 = len(toks2)
    with ctx.server(core, args, name="first") as srv:
        check_store(res, srv, store)
        turn1_and_continue(res, ctx, srv, conv)
        srv.settle()
    res.check(srv.rc == 0, "first server: SIGTERM, exit 0")
    files = record_files(d)
    res.note(f"{len(files)} record files after the first server: "
             + ", ".join(f"{c}:{'row' if r else 'pages'}" for c, r in
                         sorted((rec_consumed(p), rec_has_row(p)) for p in files)))
    res.check(any(rec_consumed(p) == conv.t1 for p in files), f"T1's record ({conv.t1}) on disk")
    with ctx.server(core, args, name="second") as srv:
        n = scanned(srv)
        res.check(n is not None and n >= 1, "second server scanned the records", f"{n}")
        m1 = srv.metrics()
        r2 = srv.chat(**body2)
        f = r2["flare"]
        m2 = srv.settle()
        res.check(f["source"] == "disk" and f["reused_host_tokens"] == conv.t1
                  and f["reused_gpu_tokens"] == 0,
                  f"replayed turn 2: disk hit of T1 = {conv.t1}", f"{f}")
        res.check(f["prefill_tokens"] == n2 - conv.t1
                  and f["prefill_launches"] == expected_launches(toks2, conv.t1),
                  f"prefill limited to the {n2 - conv.t1} new tokens "
                  f"({expected_launches(toks2, conv.t1)} launches)", f"{f}")
        res.check(m2.delta(m1, "flare_host_cache_fetches_total") == 1
                  and m2.delta(m1, "flare_host_cache_bytes_in_total", tier="nvme") > 0,
                  "metrics: one restore, bytes in from nvme",
                  f"{m2.delta(m1, 'flare_host_cache_bytes_in_total', tier='nvme'):.0f} B")
        same_as_reference(res, ctx, core, "chat", body2, r2, "replayed turn 2")


def sc_branching(ctx, core, store, res):
    """Two continuations of one evicted prefix admitted together share one
    inbound ticket (one fetch) and both complete with host reuse.

    Over HTTP "together" means the second arrives while the first's
    restore is in flight.  The server runs with the test hook
    FLARE_TEST_HOLD_INBOUND (engine.h test_hold_inbound): while its file
    exists, completed restores are held back, so both continuations are
    posted, the scenario waits until both wait on the restore
    (flare_host_cache_inbound_waiting == 2), then removes the file.  No
    race with the restore's speed: the outcome is decided by conditions."""
    ctx.need(core, store)
    res.core = core.name
    nfill = filler_count(ctx, core)
    d = ctx.dir("branching") if store in ("disk", "composite") else None
    base = core.args(ctx.flare)
    big = core.user1 + 2 * core.max_tokens + core.user2 + 80
    mem = memory_for(ctx, core, "ordinary", [core.filler + 20] * (nfill + 2) + [big] * 6)
    args = base + store_args(ctx, store, core, d, mem)
    hold = os.path.join(ctx.dir("branching-hold"), "hold")
    env = dict(os.environ, FLARE_TEST_HOLD_INBOUND=hold)
    with Flare(ctx.flare, args, core=core.path, env=env, name="flare",
               log=ctx.log if ctx.verbose else None) as srv:
        check_store(res, srv, store)
        conv = Conversation(ctx, core, seed=31)
        turn1_and_continue(res, ctx, srv, conv, "turn 1")
        fillers(ctx, srv, core, nfill, seed=41)
        m1 = srv.settle()
        bodies = [conv.follow_up(f"branch {k}: " + conv.user2(k))[0] for k in (0, 1)]
        out = {}

        def post():
            try:
                out["rs"] = srv.post_together([("/v1/chat/completions", b) for b in bodies])
            except Exception as exc:  # reported below, in the scenario's thread
                out["err"] = exc

        with open(hold, "w"):
            pass
        t = threading.Thread(target=post, daemon=True)
        t.start()
        try:
            srv.wait_metric(lambda m: m.get("flare_host_cache_inbound_waiting") >= 2,
                            timeout=60.0, what="both continuations waiting on the restore")
            res.check(True, "both continuations wait on one restore (inbound_waiting 2)")
        except FlareError as exc:
            res.check(False, "both continuations wait on one restore (inbound_waiting 2)",
                      str(exc))
        finally:
            os.unlink(hold)
        t.join(timeout=120.0)
        if "err" in out or "rs" not in out:
            res.check(False, "both continuations answered", repr(out.get("err", "timeout")))
            return
        rs = out["rs"]
        m2 = srv.settle()
        fetches = m2.delta(m1, "flare_host_cache_fetches_total")
        hosts = [r["flare"]["reused_host_tokens"] for r in rs]
        gpus = [r["flare"]["reused_gpu_tokens"] for r in rs]
        res.note(f"T1 {conv.t1}, fetches +{fetches:.0f}, host reuse {hosts}, GPU reuse {gpus}")
        res.check(fetches == 1, "one fetch (one inbound ticket) for both continuations",
                  f"+{fetches:.0f}")
        res.check(hosts == [conv.t1, conv.t1],
                  f"both continuations restored T1 = {conv.t1} from the host", f"{hosts}")
        res.check(m2.delta(m1, "flare_host_cache_hits_total") == 2,
                  "metrics: two host hits (admissions) for one fetch",
                  f"+{m2.delta(m1, 'flare_host_cache_hits_total'):.0f}")
        for k, (b, r) in enumerate(zip(bodies, rs)):
            res.check(r["choices"][0]["finish_reason"] in ("stop", "length"),
                      f"continuation {k + 1} completed", r["choices"][0]["finish_reason"])
            same_as_reference(res, ctx, core, "chat", b, r, f"continuation {k + 1}")


# ---- disk records -------------------------------------------------------------------

REC_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{32})\.ckpt$")


def record_files(base):
    out = []
    for root, _, names in os.walk(base):
        for n in names:
            if REC_RE.match(n):
                out.append(os.path.join(root, n))
    return out


def rec_consumed(path):
    return int(REC_RE.match(os.path.basename(path)).group(1), 16)


def rec_header(path):
    with open(path, "rb") as fh:
        h = fh.read(192)
    hb, ranks, pt, tail = struct.unpack_from("<IIII", h, 16)
    page_off, row_off = struct.unpack_from("<QQ", h, 144)
    return {"header_bytes": hb, "ranks": ranks, "tail": tail, "page_off": page_off,
            "row_off": row_off, "size": os.path.getsize(path)}


def rec_has_row(path):
    h = rec_header(path)
    return h["size"] > h["row_off"]


def flip(path, offset):
    with open(path, "r+b") as fh:
        fh.seek(offset)
        b = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([b[0] ^ 0x5a]))


def namespaces(base):
    return sorted(n for n in os.listdir(base) if os.path.isdir(os.path.join(base, n)))


def sc_corruption(ctx, core, store, res):
    """A flipped byte in a record file gives a miss or a failed restore, a
    recompute, the right answer, and a rise of the corrupt counter."""
    ctx.need(core, store)
    conv = Conversation(ctx, core, seed=4)
    body2, toks2 = conv.follow_up(conv.user2())
    n2 = len(toks2)
    mem = memory_for(ctx, core, "ordinary", [conv.t1 + core.user2 + core.max_tokens + 40] * 4)
    for where in ("page", "row", "header"):
        d = ctx.dir(f"corrupt-{where}")
        args = core.args(ctx.flare) + store_args(ctx, store, core, d, mem, drain=True)
        with ctx.server(core, args, name="writer") as srv:
            check_store(res, srv, store)
            turn1_and_continue(res, ctx, srv, conv, f"{where}: turn 1")
            srv.settle()
        files = record_files(d)
        chain = sorted((p for p in files if rec_consumed(p) <= conv.t1), key=rec_consumed)
        t1 = [p for p in chain if rec_consumed(p) == conv.t1]
        res.require(len(t1) == 1, f"{where}: T1's record ({conv.t1}) on disk",
                    f"{[rec_consumed(p) for p in files]}")
        target = t1[0]
        h = rec_header(target)
        if where == "page":
            with_pages = [p for p in chain if rec_header(p)["tail"] > 0]
            res.require(with_pages, f"{where}: a record of T1's chain holds pages")
            target = with_pages[-1]
            h = rec_header(target)
            off = h["page_off"] + (h["tail"] - 1) * ((h["row_off"] - h["page_off"]) // h["tail"]) + 100
        elif where == "row":
            res.require(h["size"] > h["row_off"], f"{where}: T1's record holds its row")
            off = h["row_off"] + 100
        else:
            off = 170  # inside the creation time: only the header checksum covers it
        flip(target, off)
        res.note(f"{where}: flipped the byte at {off} of {os.path.basename(target)} "
                 f"(consumed {rec_consumed(target)})")
        with ctx.server(core, args, name="reader") as srv:
            m1 = srv.metrics()
            r2 = srv.chat(**body2)
            f = r2["flare"]
            m2 = srv.settle()
            corrupt = m2.sum("flare_host_cache_corrupt_total")
            failed = m2.delta(m1, "flare_host_cache_restore_failures_total")
            res.check(corrupt >= 1, f"{where}: the corrupt counter rose", f"{corrupt:.0f}")
            res.check(f["reused_host_tokens"] < conv.t1 or failed >= 1,
                      f"{where}: a miss or a failed restore",
                      f"{f}, restore failures +{failed:.0f}")
            res.check(f["prefill_tokens"] == n2 - f["reused_tokens"],
                      f"{where}: the rest recomputed", f"{f}")
            same_as_reference(res, ctx, core, "chat", body2, r2, f"{where}: turn 2")


def sc_namespaces(ctx, core, store, res):
    """Ordinary and speculative runs on one directory never hit each
    other's records; --max-active and --draft-tokens keep their hits; a core
    with another layout misses."""
    ctx.need(core, store)
    if "copy" not in core.modes:
        raise Skip(f"core {core.name} has no speculative modes")
    d = ctx.dir("namespaces")
    a = Conversation(ctx, core, seed=5)
    b = Conversation(ctx, core, seed=6)
    body_a, _ = a.follow_up(a.user2())
    body_b, _ = b.follow_up(b.user2())

    def run(mode, extra=(), path_core=None, name=None):
        c = path_core or core
        mem = memory_for(ctx, c, mode, [max(a.t1, b.t1) + core.user2 + core.max_tokens + 40] * 8)
        args = c.args(ctx.flare, mode) + list(extra) + store_args(ctx, store, c, d, mem, drain=True)
        return ctx.server(c, args, name=name or mode)

    def hit(srv, body):
        return srv.chat(**body)["flare"]

    with run("ordinary") as srv:
        check_store(res, srv, store)
        turn1_and_continue(res, ctx, srv, a, "ordinary: conversation A turn 1")
    for mode in ("copy", "learned"):
        with run(mode) as srv:
            res.check(scanned(srv) == 0, f"{mode}: its own namespace starts empty",
                      f"{scanned(srv)} scanned")
            f = hit(srv, body_a)
            res.check(f["reused_host_tokens"] == 0, f"{mode}: no hit on ordinary records", f"{f}")
            if mode == "copy":
                turn1_and_continue(res, ctx, srv, b, "copy: conversation B turn 1")
    ns = namespaces(d)
    res.check(len(ns) == 3, "three namespace directories (ordinary, copy, learned)", f"{ns}")
    with run("ordinary", ["--max-active", str(core.max_active + 1)], name="ordinary-max-active") as srv:
        res.check((scanned(srv) or 0) >= 1, "ordinary, --max-active changed: records scanned",
                  f"{scanned(srv)}")
        f = hit(srv, body_a)
        res.check(f["source"] == "disk" and f["reused_host_tokens"] == a.t1,
                  f"ordinary, --max-active {core.max_active + 1}: A still hits T1 = {a.t1}", f"{f}")
        f = hit(srv, body_b)
        res.check(f["reused_host_tokens"] == 0, "ordinary: no hit on copy records (B)", f"{f}")
    with run("copy", ["--draft-tokens", "2"], name="copy-draft-2") as srv:
        f = hit(srv, body_b)
        res.check(f["source"] == "disk" and f["reused_host_tokens"] == b.t1,
                  f"copy, --draft-tokens 2: B still hits T1 = {b.t1}", f"{f}")
    # Another layout: tiny's text with a wider key plane, in a temp file.
    other = os.path.join(ctx.dir("core"), "wide-key.core")
    src = core.path or os.path.join(repo_root(), "cores", "tiny.core")
    with open(src) as fh:
        txt = fh.read()
    txt2, nsub = re.subn(r"(\[plane [^\]]+\]\s*\n\s*token_bytes\s*=\s*)(\d+)",
                         lambda m: m.group(1) + str(int(m.group(2)) * 2), txt, count=1)
    res.require(nsub == 1, "a core copy with one plane twice as wide")
    with open(other, "w") as fh:
        fh.write(txt2)
    wide = Core(core.name + "-wide", other, core.user1, core.user2, core.filler,
                core.gpu_pages, core.max_active, core.max_tokens, core.modes)
    with run("ordinary", path_core=wide, name="other-layout") as srv:
        res.check(scanned(srv) == 0, "another layout: its own namespace, nothing scanned",
                  f"{scanned(srv)}")
        r = srv.chat(**body_a)
        res.check(r["flare"]["reused_host_tokens"] == 0, "another layout: A misses",
                  f"{r['flare']}")
    ns = namespaces(d)
    res.check(len(ns) == 4, "four namespace directories", f"{ns}")


def sc_fetch_choice(ctx, core, store, res):
    """--prefix-cache-fetch auto picks the faster path, for a short and a
    long first turn (1,000 and 12,000 tokens: on Qwen TP1, whose 104 MiB row
    costs a restore the same at any length, the first is faster to
    recompute from disk and the second to restore).  For each length the
    same three conversations run on three servers, --prefix-cache-fetch
    always, never and auto: turn 1, the continue request, fillers that evict
    the GPU cache, then turn 2 (one new token) timed from request to
    response.  always must restore every turn 2 and never recompute each;
    their medians are the restore and recompute times.  auto, warmed by the
    rounds before, must choose in the last round a path no more than 1.2x
    slower than the faster one (bench/policy's criterion).  auto may also
    split the hit (the default --prefix-cache-overlap auto: the head
    recomputed while the tail loads, when the two paths are close); such a
    turn is judged by its own time."""
    ctx.need(core, store)
    rounds = 3
    for length in (1000, 12000):
        c = Core(f"{core.name}-{length}", core.path, length, core.user2, core.filler,
                 max(core.gpu_pages, (length + core.user2 + 3 * core.max_tokens) // 64 + 16),
                 core.max_active, core.max_tokens, core.modes)
        c.geo = core.geo  # same core file, same geometry
        fetch_choice_length(ctx, c, store, res, rounds, length)


def fetch_choice_length(ctx, core, store, res, rounds, length):
    nfill = filler_count(ctx, core)
    convs = [Conversation(ctx, core, seed=70 + k) for k in range(rounds)]
    big = max(c.t1 for c in convs) + core.user2 + core.max_tokens + 40
    mem = memory_for(ctx, core, "ordinary", [core.filler + 20] * (nfill + 2) + [big] * (rounds + 2))
    runs = {}
    for mode in ("always", "never", "auto"):
        d = ctx.dir(f"fetch-{mode}") if store in ("disk", "composite") else None
        args = core.args(ctx.flare) + store_args(ctx, store, core, d, mem, fetch=mode)
        runs[mode] = []
        with ctx.server(core, args, name=f"fetch-{mode}") as srv:
            check_store(res, srv, store)
            for k, conv in enumerate(convs):
                what = f"{length} tokens, {mode}, round {k + 1}"
                turn1_and_continue(res, ctx, srv, conv, f"{what}: turn 1")
                fillers(ctx, srv, core, nfill, seed=80 + k)
                m1 = srv.settle()
                body2 = dict(conv.follow_up(conv.user2())[0], max_tokens=1)
                t0 = time.monotonic()
                r2 = srv.chat(**body2)
                dt = time.monotonic() - t0
                m2 = srv.settle()
                f = r2["flare"]
                restored = f["reused_host_tokens"] == conv.t1
                split = (f["overlap_tokens"] > 0 and f["reused_gpu_tokens"] == 0
                         and f["reused_host_tokens"] + f["overlap_tokens"] == conv.t1)
                declined = m2.delta(m1, "flare_host_cache_fetch_declined_total")
                if mode == "always":
                    res.check(restored and f["reused_gpu_tokens"] == 0,
                              f"{what}: turn 2 restored T1 = {conv.t1} from the host", f"{f}")
                elif mode == "never":
                    res.check(f["reused_host_tokens"] == 0 and f["reused_gpu_tokens"] == 0
                              and declined == 1,
                              f"{what}: turn 2 recomputed, the host hit declined",
                              f"{f}, declined +{declined:.0f}")
                else:
                    res.check(restored or split
                              or (f["reused_host_tokens"] == 0 and declined == 1),
                              f"{what}: turn 2 restored T1, split it (head recomputed, tail "
                              "restored) or declined the hit", f"{f}")
                same_as_reference(res, ctx, core, "chat", body2, r2, f"{what}: turn 2")
                runs[mode].append((dt, "split" if split else "restored" if restored else ""))
            m = srv.metrics()
            tier = "nvme" if store == "disk" else "dram"
            res.note(f"{length} tokens, {mode}: turn 2 took "
                     + ", ".join(f"{dt * 1e3:.0f} ms" + (f" ({r})" if r else "")
                                 for dt, r in runs[mode])
                     + f"; estimates {tier} "
                     f"{m.value('flare_host_cache_transfer_fixed_seconds', tier=tier) * 1e6:.0f} us + "
                     f"{m.value('flare_host_cache_transfer_rate_bytes_per_second', tier=tier) / 1e9:.2f} GB/s, "
                     f"prefill {m.value('flare_prefill_rate_tokens_per_second'):.0f} tok/s")

    def median(v):
        v = sorted(v)
        return v[len(v) // 2]
    restore = median([dt for dt, _ in runs["always"]])
    recompute = median([dt for dt, _ in runs["never"]])
    best = min(restore, recompute)
    last_dt, last_path = runs["auto"][-1]
    # A split has no always/never median of its own: its own time.
    chosen = {"restored": restore, "split": last_dt}.get(last_path, recompute)
    res.check(chosen <= 1.2 * best,
              f"{length} tokens, auto, round {rounds}: "
              f"{last_path or 'recomputed'}, "
              "no more than 1.2x slower than the faster path",
              f"restore {restore * 1e3:.0f} ms, recompute {recompute * 1e3:.0f} ms (medians of "
              f"{rounds}); the chosen path {chosen / best:.2f}x the faster, auto's own turn 2 "
              f"{last_dt * 1e3:.0f} ms")


def start_pool(ctx, what):
    """A `flare pool` for one scenario: (process, socket), stopped by the
    caller (stop_pool)."""
    import subprocess
    from flare import die_with_parent
    d = ctx.dir(what)
    sock, log = os.path.join(d, "p.sock"), os.path.join(d, "mgr.log")
    with open(log, "w") as lf:
        p = subprocess.Popen([ctx.flare, "pool", "--socket", sock, "--memory", "256MiB"],
                             stdin=subprocess.DEVNULL, stdout=lf, stderr=lf,
                             preexec_fn=die_with_parent)
    deadline = time.monotonic() + 20
    while "listening on unix:" not in open(log).read():
        if p.poll() is not None or time.monotonic() > deadline:
            p.kill()
            raise FlareError("flare pool did not start: " + open(log).read()[-500:])
        time.sleep(0.02)
    return p, sock


def stop_pool(p):
    p.terminate()
    p.wait(20)


def pool_settled(srv):
    m = srv.settle()
    return m.get("flare_pool_puts_total") == (m.get("flare_pool_puts_accepted_total")
                                              + m.get("flare_pool_puts_refused_total")
                                              + m.get("flare_pool_puts_failed_total"))


def sc_pool(ctx, core, store, res):
    """The pool with each local-tier combination (design 1's four pool
    rows; `none` is pool only): instance A with `store` and the pool
    computes turn 1; instance B (pool only) answers it from A's GPU copy
    (source neighbour); with local tiers, A's last tier is filled until its
    oldest records cascade into the pool (nothing put at publication,
    nothing dropped); A stops; a restarted B answers it from the arena
    (source pool); every answer the reference's."""
    ctx.need(core, store)
    conv = Conversation(ctx, core, seed=9)
    mgr, sock = start_pool(ctx, "pool")
    try:
        d = ctx.dir("pool-disk")
        mem = memory_for(ctx, core, "ordinary", [conv.t1 + core.max_tokens + 40] * 4)
        pool = ["--prefix-cache-pool", "unix:" + sock, "--prefix-cache-fetch", "always",
                "--prefix-cache-pool-grace", "2s"]  # restores asserted: no 2 ms race
        a_args = core.args(ctx.flare) + store_args(ctx, store, core, d, mem) + pool
        if store in ("disk", "composite"):  # A's disk fills too (the cascade below)
            a_args[a_args.index("4GiB")] = f"{mem // 1024}KiB"
        b_args = core.args(ctx.flare) + pool
        body = conv.body1()
        with ctx.server(core, a_args, name="A") as a, ctx.server(core, b_args, name="B") as b:
            res.require("shared through unix:" + sock in a.summary(), "A names the pool",
                        a.summary())
            r = a.chat(**body)
            same_as_reference(res, ctx, core, "chat", body, r, "A's turn 1")
            wait = time.monotonic() + 30
            while not pool_settled(a):
                res.require(time.monotonic() < wait, "A's copies into the pool settle")
                time.sleep(0.02)
            r = b.chat(**body)
            f = r["flare"]
            res.check(f["source"] == "neighbour" and f["reused_host_tokens"] > 0,
                      "B: restored from A's GPU copy (neighbour)", f"{f}")
            same_as_reference(res, ctx, core, "chat", body, r, "B's turn 1")
            # A's stats snapshot is published after its worker's iteration.
            wait = time.monotonic() + 10
            while a.metrics().get("flare_pool_exports_served_total") < 1 and \
                    time.monotonic() < wait:
                time.sleep(0.02)
            served = a.metrics().get("flare_pool_exports_served_total")
            res.check(served >= 1, "A served the export", f"{served:.0f}")
            if store != "none":
                # Design 2.15: A's records reach the pool when they cascade
                # off the end of its local chain (oldest first, held until
                # the manager took them): fill A's last tier with other
                # prompts until turn 1's records have gone.
                res.check(a.metrics().get("flare_pool_puts_total") == 0,
                          "A put nothing into the pool at publication", "")
                rng = random.Random(4242)
                wait = time.monotonic() + 60
                while a.metrics().get("flare_pool_cascaded_total") < 3:
                    res.require(time.monotonic() < wait, "A's oldest records cascade to the pool")
                    a.chat(messages=[{"role": "user", "content": text(rng, core.user1)}],
                           max_tokens=core.max_tokens, temperature=0)
                    while not pool_settled(a) and time.monotonic() < wait:
                        time.sleep(0.02)
                m = a.metrics()
                dropped = m.get("flare_host_cache_dropped_total",
                                tier="dram" if store == "memory" else "nvme",
                                reason="end_of_chain")
                res.check(dropped == 0, "nothing dropped at the end of A's chain",
                          f"{dropped:.0f}")
        with ctx.server(core, b_args, name="B2") as b:
            r = b.chat(**body)
            f = r["flare"]
            res.check(f["source"] == "pool" and f["reused_host_tokens"] > 0,
                      "restarted B, A gone: restored from the arena (pool)", f"{f}")
            same_as_reference(res, ctx, core, "chat", body, r, "restarted B's turn 1")
        # Issue 18: a pool hit restored overlapped (every hit split at its
        # middle page): the head recomputed and checked against the
        # digests the claim's head pages give, the tail from the arena.
        with ctx.server(core, b_args + ["--prefix-cache-overlap", "always"], name="B3") as b:
            r = b.chat(**body)
            f = r["flare"]
            m = b.settle()
            res.check(f["source"] == "pool" and f["overlap_tokens"] > 0 and
                      m.get("flare_host_cache_overlapped_completed_total") == 1 and
                      m.get("flare_host_cache_overlap_mismatches_total") == 0,
                      "B, overlap always: the head recomputed, the tail from the arena", f"{f}")
            same_as_reference(res, ctx, core, "chat", body, r, "B's overlapped turn 1")
    finally:
        stop_pool(mgr)


SCENARIOS = {
    "gpu-only": (sc_gpu_only, ("none",)),
    "memory-hit": (sc_memory_hit, ("memory", "disk", "composite")),
    "restart": (sc_restart, ("disk", "composite")),
    "branching": (sc_branching, ("memory", "disk", "composite")),
    "namespaces": (sc_namespaces, ("disk", "composite")),
    "corruption": (sc_corruption, ("disk", "composite")),
    "fetch-choice": (sc_fetch_choice, ("memory", "disk")),
    "pool": (sc_pool, ("none", "memory", "disk", "composite")),
}


def run_one(ctx, fn, core, store, scenario):
    res = Result(scenario, store, core.name)
    t0 = time.monotonic()
    try:
        fn(ctx, core, store, res)
    except Skip as e:
        res.status = "SKIP"
        res.lines.append(f"skip {e}")
    except Fail:
        pass
    except Exception as e:  # noqa: BLE001 - a scenario error is a failure with its trace
        res.status = "FAIL"
        res.lines.append(f"FAIL {type(e).__name__}: {e}")
        res.lines += ["     " + ln for ln in traceback.format_exc().splitlines()[-6:]]
    res.seconds = time.monotonic() - t0
    return res


def main(argv=None):
    install_cleanup()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flare", help="the flare binary (default $SELENE_BUILD/flare or build/flare)")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="tiny core, small sizes (default)")
    g.add_argument("--full", action="store_true", help="also the realistic and other cores")
    ap.add_argument("--stores", default="memory,disk,composite")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--cores", help="comma-separated core names (default by mode)")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args(argv)
    flare_bin = find_flare(a.flare)
    if not os.access(flare_bin, os.X_OK):
        print(f"host_cache: no flare binary at {flare_bin}", file=sys.stderr)
        return 2
    table = core_table(repo_root())
    if a.cores:
        names = a.cores.split(",")
    elif a.full:
        names = ["tiny", "qwen-tp1", "qwen-tp1-small", "qwen-tp2-small", "deepseek-small",
                 "hybrid-small"]
    else:
        names = ["tiny"]
    for n in names:
        if n not in table:
            print(f"host_cache: unknown core {n} (known: {', '.join(table)})", file=sys.stderr)
            return 2
    scen = a.scenarios.split(",")
    for s in scen:
        if s not in SCENARIOS:
            print(f"host_cache: unknown scenario {s}", file=sys.stderr)
            return 2
    stores = set(a.stores.split(",")) | {"none"}
    # The realistic core runs the scenarios that its sizes are for.
    heavy_only = {"qwen-tp1": {"gpu-only", "memory-hit", "restart", "branching", "fetch-choice"}}
    # And only it runs fetch-choice: on the small cores a restore and a
    # recompute both take less than the noise of an HTTP request.
    realistic_only = {"fetch-choice": {"qwen-tp1"}}

    results = []
    tmp = TempDir("flare-qualify-")
    ctx = Ctx(flare_bin, not a.full, a.verbose, tmp.path)
    t0 = time.monotonic()
    try:
        for name in names:
            core = table[name]
            for s in scen:
                if name in heavy_only and s not in heavy_only[name]:
                    continue
                if s in realistic_only and name not in realistic_only[s]:
                    continue
                fn, kinds = SCENARIOS[s]
                for st in kinds:
                    if st not in stores:
                        continue
                    res = run_one(ctx, fn, core, st, s)
                    results.append(res)
                    print(f"{res.status} {res.name()} ({res.seconds:.1f}s)", flush=True)
                    if res.status != "PASS" or a.verbose:
                        for ln in res.lines:
                            print("    " + ln)
            ctx.close()
    finally:
        ctx.close()
        tmp.cleanup()
    np_ = sum(r.status == "PASS" for r in results)
    nf = sum(r.status == "FAIL" for r in results)
    ns = sum(r.status == "SKIP" for r in results)
    print(f"host_cache: {np_} passed, {nf} failed, {ns} skipped "
          f"({time.monotonic() - t0:.0f}s)")
    return 1 if nf else 0


if __name__ == "__main__":
    sys.exit(main())
