"""flare.py - a small harness for driving `flare run` from Python scripts.

Standard library only.  It launches `flare run` with the given flags on a
free port (``--port 0``; the port comes from the "listening on" line),
drains its stderr on a thread (kept for reports), talks to it over HTTP
(JSON requests, server-sent events with arrival timestamps, /metrics), and
stops it with SIGTERM, checking the exit status.  Processes and temporary
directories are cleaned up on every path, including failures, timeouts,
SIGTERM (install_cleanup) and a SIGKILL of the script (its servers die
with it; its directories are reaped by the next run).

Used by qualify/host_cache.py (the qualification scenarios of design
section 4) and bench/serve.py (the isolation measurements).

    with TempDir("flare-q") as tmp, Flare(binary, ["--prefix-cache-memory", "1MiB"]) as f:
        r = f.chat([{"role": "user", "content": "hello"}], max_tokens=8)
        print(r["flare"], f.metrics().value("flare_host_cache_hits_total"))

The chat template of the reference engine (src/helios/tokenizer.c) is
reproduced in chat_tokens() so scripts can reason about token positions:
BEGIN, then for each message `role ": " content MESSAGE`, then
`"assistant: "`.  One token per byte.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

TOK_BEGIN = 256
TOK_END = 257
TOK_MESSAGE = 258

START_TIMEOUT = 60.0
STOP_TIMEOUT = 60.0


class FlareError(Exception):
    """The server misbehaved: did not start, answered an error, or did not
    stop cleanly.  The message names what happened and includes the tail of
    its stderr."""


def chat_tokens(messages, generation_prompt=True):
    """The token ids the engine's chat template makes of `messages`."""
    out = [TOK_BEGIN]
    for m in messages:
        out += list(m["role"].encode())
        out += list(b": ")
        out += list((m.get("content") or "").encode())
        out.append(TOK_MESSAGE)
    if generation_prompt:
        out += list(b"assistant: ")
    return out


def message_ends(tokens):
    """Consumed counts just after each MESSAGE token (the engine's message
    checkpoints)."""
    return [i + 1 for i, t in enumerate(tokens) if t == TOK_MESSAGE]


# ---- nothing left running or lying around ---------------------------------------
#
# A script stopped by a timeout or a signal must not leave servers serving
# or multi-gigabyte directories behind.  Three layers:
#   - every child this module starts (and die_with_parent() for others)
#     gets PR_SET_PDEATHSIG = SIGKILL: when the script dies, however, its
#     children die with it (they run in sessions of their own, which the
#     process-group kill of `timeout` or of tests/run-tests does not reach);
#   - install_cleanup() turns SIGTERM and SIGHUP into SystemExit, so the
#     `with` blocks and `finally` clauses stop servers and remove
#     directories as on any error;
#   - TempDir writes its owner's pid and start time into the directory and
#     removes, when it makes a new one, directories of its prefix whose
#     owner no longer runs (the script was SIGKILLed).

_PR_SET_PDEATHSIG = 1
try:
    import ctypes
    _prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork
except (ImportError, OSError, AttributeError):
    _prctl = None


def die_with_parent():
    """A preexec_fn: the child gets a session of its own and is SIGKILLed
    when the thread that started it ends (the whole script, for children
    started by the main thread), and exits at once if that already
    happened."""
    parent = os.getppid()
    os.setsid()
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def install_cleanup():
    """SIGTERM and SIGHUP raise SystemExit in the main thread, so cleanup
    code runs as for any error (SIGINT already raises KeyboardInterrupt)."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def _start_time(pid):
    """The process's start time in clock ticks (/proc/PID/stat field 22),
    or None when it does not run."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


OWNER_FILE = ".flare-owner"


def reap_stale(prefix, base=None):
    """Remove directories named prefix* under base (the temporary
    directory) whose owner file names a process that no longer runs.
    Returns the paths removed."""
    base = base or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for n in names:
        if not n.startswith(prefix):
            continue
        path = os.path.join(base, n)
        try:
            with open(os.path.join(path, OWNER_FILE)) as fh:
                pid, start = (int(x) for x in fh.read().split())
        except (OSError, ValueError):
            continue  # not one of ours, or being created
        if _start_time(pid) != start:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class TempDir:
    """A temporary directory removed on exit, whatever happened; one left
    by a killed owner is removed by the next TempDir of the same prefix."""

    def __init__(self, prefix="flare-qualify-", base=None):
        reap_stale(prefix, base)
        self.path = tempfile.mkdtemp(prefix=prefix, dir=base)
        with open(os.path.join(self.path, OWNER_FILE), "w") as fh:
            fh.write(f"{os.getpid()} {_start_time(os.getpid())}\n")

    def __enter__(self):
        return self.path

    def __exit__(self, *exc):
        self.cleanup()
        return False

    def cleanup(self):
        shutil.rmtree(self.path, ignore_errors=True)


class Metrics:
    """Parsed Prometheus text: samples keyed by (name, sorted label items)."""

    LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)')
    LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

    def __init__(self, text, when=None):
        self.text = text
        self.when = time.monotonic() if when is None else when
        self.samples = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = self.LINE.match(line)
            if not m:
                continue
            labels = tuple(sorted(self.LABEL.findall(m.group(3) or "")))
            try:
                v = float(m.group(4))
            except ValueError:
                continue
            self.samples[(m.group(1), labels)] = v

    def value(self, name, **labels):
        """The sample with exactly these labels; KeyError when absent."""
        key = (name, tuple(sorted(labels.items())))
        if key not in self.samples:
            raise KeyError(f"metric {name}{labels or ''} not exported")
        return self.samples[key]

    def get(self, name, default=0.0, **labels):
        try:
            return self.value(name, **labels)
        except KeyError:
            return default

    def sum(self, name, **labels):
        """Sum over every sample of `name` whose labels include `labels`."""
        want = set(labels.items())
        return sum(v for (n, ls), v in self.samples.items() if n == name and want <= set(ls))

    def labels(self, name):
        return [dict(ls) for (n, ls) in self.samples if n == name]

    def delta(self, before, name, **labels):
        return self.get(name, **labels) - before.get(name, **labels)


class HTTPResult:
    def __init__(self, status, body, headers):
        self.status = status
        self.body = body
        self.headers = headers

    def json(self):
        return json.loads(self.body)


class Stream:
    """A streamed (SSE) response: events as (monotonic arrival time, parsed
    JSON) in order, plus the time the request was sent."""

    def __init__(self, sent):
        self.sent = sent
        self.events = []
        self.done = False

    def text(self):
        out = []
        for _, ev in self.events:
            for ch in ev.get("choices") or []:
                if "text" in ch:
                    out.append(ch["text"])
                elif "delta" in ch:
                    out.append(ch["delta"].get("content") or "")
        return "".join(out)

    def token_times(self):
        """Arrival times of the chunks that carried text (one chunk per
        token batch the engine delivered)."""
        ts = []
        for t, ev in self.events:
            for ch in ev.get("choices") or []:
                piece = ch.get("text") if "text" in ch else (ch.get("delta") or {}).get("content")
                if piece:
                    ts.append(t)
        return ts

    def final(self):
        """The chunk carrying finish_reason and the flare object."""
        for _, ev in self.events:
            for ch in ev.get("choices") or []:
                if ch.get("finish_reason"):
                    return ev
        return None

    def usage(self):
        for _, ev in self.events:
            if ev.get("usage"):
                return ev["usage"]
        return None


class Flare:
    """One `flare run` process.  Use as a context manager, or call start()
    and stop() yourself (stop() is safe to call twice)."""

    def __init__(self, binary, args=(), core=None, env=None, name="flare",
                 start_timeout=START_TIMEOUT, log=None):
        self.binary = binary
        self.args = list(args)
        self.core = core
        self.env = env
        self.name = name
        self.start_timeout = start_timeout
        self.log = log
        self.proc = None
        self.port = None
        self.base = None
        self.lines = []
        self.startup = []
        self._lock = threading.Lock()
        self._drain = None
        self.rc = None

    # ---- lifecycle --------------------------------------------------------

    def command(self):
        cmd = [self.binary, "run", "--port", "0", "--dashboard", "off"] + self.args
        if self.core:
            cmd.append(self.core)
        return cmd

    def start(self, wait=True):
        """Start the process; wait (default) for its "listening on" line.
        wait=False returns at once: call wait_started() later (the process
        is the caller's thread's child: it dies with that thread)."""
        cmd = self.command()
        if self.log:
            self.log("$ " + " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace",
                                     env=self.env, preexec_fn=die_with_parent)
        found = threading.Event()

        def drain():
            for line in self.proc.stderr:
                with self._lock:
                    self.lines.append(line.rstrip("\n"))
                if not found.is_set():
                    m = re.search(r"listening on http://(\S+):(\d+)", line)
                    if m:
                        self.port = int(m.group(2))
                        found.set()
            found.set()

        self._drain = threading.Thread(target=drain, daemon=True)
        self._drain.start()
        self._found = found
        return self.wait_started() if wait else self

    def wait_started(self):
        self._found.wait(self.start_timeout)
        if self.port is None:
            self._kill()
            raise FlareError(f"{self.name} did not start (exit {self.proc.returncode}): "
                             + self.stderr_tail())
        with self._lock:
            self.startup = list(self.lines)
        self.base = f"http://127.0.0.1:{self.port}"
        return self

    def summary(self):
        """The startup lines (core, prefix cache, listening)."""
        return "\n".join(self.startup)

    def store(self):
        """The selected store from the startup summary: disabled, memory,
        disk or composite."""
        for line in self.startup:
            m = re.search(r"prefix cache: (\w+)", line)
            if m:
                return m.group(1)
        return "unknown"

    def disk_note(self):
        for line in self.startup:
            m = re.search(r"no disk store: (.*)$", line)
            if m:
                return m.group(1)
        return ""

    def stderr_tail(self, n=20):
        with self._lock:
            return "\n".join(self.lines[-n:])

    def stop(self, timeout=STOP_TIMEOUT, check=True):
        """SIGTERM, wait; kill after the timeout.  Returns the exit status;
        with check, a non-zero status raises FlareError."""
        if self.proc is None:
            return self.rc
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill()
                self._finish()
                raise FlareError(f"{self.name} did not stop within {timeout:.0f}s after SIGTERM: "
                                 + self.stderr_tail())
        self._finish()
        if check and self.rc != 0:
            raise FlareError(f"{self.name} exited {self.rc}: " + self.stderr_tail())
        return self.rc

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def _finish(self):
        self.rc = self.proc.returncode
        if self._drain:
            self._drain.join(5)
        try:
            self.proc.stderr.close()
        except OSError:
            pass
        self.proc = None

    def kill(self):
        """SIGKILL (a crash); no exit status check."""
        if self.proc:
            self._kill()
            self._finish()

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            try:
                self.stop(timeout=15, check=False)
            except FlareError:
                pass
            return False
        self.stop()
        return False

    # ---- HTTP ---------------------------------------------------------------

    def request(self, method, path, body=None, timeout=120.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return HTTPResult(r.status, r.read(), dict(r.headers))
        except urllib.error.HTTPError as e:
            return HTTPResult(e.code, e.read(), dict(e.headers))

    def post(self, path, body, timeout=120.0):
        """POST JSON; the parsed answer.  A non-200 status raises FlareError."""
        r = self.request("POST", path, body, timeout)
        if r.status != 200:
            raise FlareError(f"POST {path}: HTTP {r.status}: {r.body[:500]!r}")
        return r.json()

    def get(self, path, timeout=30.0):
        r = self.request("GET", path, None, timeout)
        if r.status != 200:
            raise FlareError(f"GET {path}: HTTP {r.status}: {r.body[:500]!r}")
        return r.body.decode()

    def metrics(self):
        return Metrics(self.get("/metrics"))

    def complete(self, prompt, max_tokens=16, temperature=0, **extra):
        """POST /v1/completions; prompt is a string or a list of token ids."""
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
        body.update(extra)
        return self.post("/v1/completions", body)

    def chat(self, messages, max_tokens=16, temperature=0, **extra):
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": temperature}
        body.update(extra)
        return self.post("/v1/chat/completions", body)

    def stream(self, path, body, timeout=300.0, on_first=None):
        """POST with "stream": true; a Stream of timestamped events.
        on_first, if given, is called once when the first event arrives."""
        body = dict(body, stream=True)
        data = json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        s = Stream(time.monotonic())
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                for raw in r:
                    now = time.monotonic()
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data: "):
                        continue
                    payload = line[6:]
                    if payload == "[DONE]":
                        s.done = True
                        break
                    ev = json.loads(payload)
                    if "error" in ev:
                        raise FlareError(f"stream error: {ev['error']}")
                    s.events.append((now, ev))
                    if on_first and len(s.events) == 1:
                        on_first()
        except urllib.error.HTTPError as e:
            raise FlareError(f"POST {path} (stream): HTTP {e.code}: {e.read()[:500]!r}")
        return s

    def post_together(self, requests, timeout=120.0):
        """POST several JSON bodies so that they reach the server at the
        same moment: every request is written on its own connection but for
        its last byte, the server reads those, then the last bytes go out back
        to back.  Returns the
        parsed answers in order (FlareError on a non-200 status)."""
        socks = []
        try:
            for path, body in requests:
                data = json.dumps(body).encode()
                head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                        "Connection: close\r\n\r\n").encode()
                s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                msg = head + data
                s.sendall(msg[:-1])
                socks.append((s, msg[-1:]))
            # Until the server has read everything but the last bytes (its
            # side of each connection has nothing queued): a condition, not
            # a fixed wait.
            self._wait_server_read([s for s, _ in socks], timeout)
            for s, last in socks:
                s.sendall(last)
            out = []
            for s, _ in socks:
                raw = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    raw += chunk
                head, _, body = raw.partition(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                if b"transfer-encoding: chunked" in head.lower():
                    body = _dechunk(body)
                if status != 200:
                    raise FlareError(f"POST (together): HTTP {status}: {body[:500]!r}")
                out.append(json.loads(body))
            return out
        finally:
            for s, _ in socks:
                s.close()

    def _wait_server_read(self, socks, timeout):
        """Until the server process has read every byte these client
        sockets sent: the server-side end of each loopback connection shows
        an empty receive queue in /proc/net/tcp."""
        want = {s.getsockname()[1] for s in socks}
        deadline = time.monotonic() + timeout
        while True:
            pending = set(want)
            with open("/proc/net/tcp") as fh:
                next(fh)
                for line in fh:
                    f = line.split()
                    local, remote, queues = f[1], f[2], f[4]
                    if int(local.split(":")[1], 16) != self.port:
                        continue
                    rport = int(remote.split(":")[1], 16)
                    if rport in pending and int(queues.split(":")[1], 16) == 0:
                        pending.discard(rport)
            if not pending:
                return
            if time.monotonic() > deadline:
                raise FlareError(f"{self.name} did not read the requests in {timeout:.0f}s")
            time.sleep(0.001)

    def wait_idle(self, timeout=60.0):
        """Until no request is pending, active or waiting for a restore and
        no copy is in flight; returns the last metrics."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            busy = (m.get("flare_requests_pending") + m.get("flare_requests_active")
                    + m.get("flare_host_cache_inbound_waiting")
                    + m.sum("flare_host_cache_transfers_in_flight"))
            if busy == 0:
                return m
            if time.monotonic() > deadline:
                raise FlareError(f"{self.name} not idle after {timeout:.0f}s")
            time.sleep(0.02)

    def settle(self, timeout=60.0):
        """Until the worker has offered every publication to the store and
        every queued copy-out has reported: no request pending, active or
        waiting for a restore, no copy-out pinned, no copy in flight, and
        the worker's last loop iteration found nothing to do
        (flare_worker_quiet, docs/metrics.md).  Returns those metrics.
        A snapshot with the last request finished is one the worker
        published at the end of that request's step or later; that
        iteration worked, so quiet there means a later one.  (A stop no longer loses
        publications the worker had not yet put -- it services the store
        once more before closing it -- but a scenario that reads metrics
        or files before stopping needs the copies landed.)"""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            busy = (m.get("flare_requests_pending") + m.get("flare_requests_active")
                    + m.get("flare_host_cache_inbound_waiting")
                    + m.get("flare_host_cache_copyout_pins")
                    + m.sum("flare_host_cache_transfers_in_flight"))
            if busy == 0 and m.get("flare_worker_quiet") == 1:
                return m
            if time.monotonic() > deadline:
                raise FlareError(f"{self.name} not settled after {timeout:.0f}s: pending "
                                 f"{m.get('flare_requests_pending'):.0f}, active "
                                 f"{m.get('flare_requests_active'):.0f}, copy-out pins "
                                 f"{m.get('flare_host_cache_copyout_pins'):.0f}, quiet "
                                 f"{m.get('flare_worker_quiet'):.0f}")
            time.sleep(0.02)

    def wait_metric(self, pred, timeout=30.0, what="condition"):
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if pred(m):
                return m
            if time.monotonic() > deadline:
                raise FlareError(f"{self.name}: timed out waiting for {what}")
            time.sleep(0.02)


def wait_for(pred, what, timeout=20.0, show=None):
    """Poll pred() every 20 ms until it is true; after timeout seconds an
    AssertionError names what (and show()'s text, when given).  The one
    condition wait of the scripted tests and scenarios."""
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out waiting for %s%s" % (
            what, ": " + show() if show else "")
        time.sleep(0.02)


def start_pool(binary, sock, args=()):
    """Start `flare pool --socket sock` with args, its output appended to
    sock + ".log", and wait (wait_for) until this start listens.  Returns
    the process, with .port the metrics port when args ask for one (0
    otherwise).  A restart on the same socket appends to the same log."""
    log = sock + ".log"
    seen = open(log).read().count("listening on unix:") if os.path.exists(log) else 0
    with open(log, "a") as out:
        p = subprocess.Popen([binary, "pool", "--socket", sock] + list(args),
                             stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                             preexec_fn=die_with_parent)

    def listening():
        text = open(log).read()
        assert p.poll() is None, "flare pool exited: " + text
        return text.count("listening on unix:") > seen
    wait_for(listening, "flare pool to listen")
    ports = re.findall(r"metrics on http://127\.0\.0\.1:(\d+)/", open(log).read())
    p.port = int(ports[-1]) if ports else 0
    return p


def geometry(binary, core=None, max_active=4, mode="ordinary"):
    """(page bytes, row bytes) of a core's GPU cache in a state mode, read
    from the refusal of `flare run --gpu-cache 1` (engine.c size_cache).
    The engine gives a quarter of --gpu-cache to rows, at least
    3 x max_active of them, and the rest to pages."""
    cmd = [binary, "run", "--port", "0", "--gpu-cache", "1", "--dashboard", "off",
           "--max-active", str(max_active)]
    if mode != "ordinary":
        cmd += ["--speculate", mode]
    if core:
        cmd.append(core)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                       preexec_fn=die_with_parent)
    m = re.search(r"pages of (\d+) bytes besides (\d+) rows of (\d+) bytes", p.stderr)
    if not m:
        raise FlareError(f"cannot read the cache geometry of {core or 'the built-in core'}: "
                         + p.stderr.strip())
    return int(m.group(1)), int(m.group(3))


def cache_split(budget, page_bytes, row_bytes, max_active):
    """(pages, rows) the engine makes of a --gpu-cache budget (engine.c
    size_cache): a quarter for rows, at least 3 x max_active, the rest
    for pages."""
    rows = max(budget // 4 // row_bytes, 3 * max_active)
    pages = (budget - rows * row_bytes) // page_bytes if budget >= rows * row_bytes else 0
    return pages, rows


def gpu_cache_for(binary, core=None, max_active=4, pages=64, mode="ordinary"):
    """The smallest --gpu-cache (to a page) that gives at least `pages`
    pages; rows follow (at least 3 x max_active)."""
    pb, rb = geometry(binary, core, max_active, mode)
    return gpu_cache_bytes(pb, rb, max_active, pages)


def gpu_cache_bytes(pb, rb, max_active, pages):
    b = 3 * max_active * rb + pages * pb
    if cache_split(b, pb, rb, max_active)[0] < pages:
        b = (pages * pb * 4) // 3 + rb
    while cache_split(b, pb, rb, max_active)[0] < pages:
        b += pb
    return b


def core_ranks(core):
    if not core:
        return 1
    with open(core) as fh:
        m = re.search(r"^\s*ranks\s*=\s*(\d+)", fh.read(), re.M)
    return int(m.group(1)) if m else 1


def _dechunk(body):
    out, pos = b"", 0
    while True:
        end = body.index(b"\r\n", pos)
        n = int(body[pos:end].split(b";")[0], 16)
        if n == 0:
            return out
        out += body[end + 2:end + 2 + n]
        pos = end + 2 + n + 2


def find_flare(argv_value=None):
    """The flare binary: the given path, $SELENE_BUILD/flare, or build/flare
    next to this checkout."""
    if argv_value:
        return os.path.abspath(argv_value)
    b = os.environ.get("SELENE_BUILD")
    if b:
        return os.path.join(b, "flare")
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "build", "flare")


def repo_root():
    return os.environ.get("SELENE_SRCDIR") or os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
