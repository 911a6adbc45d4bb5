"""Fixtures of the remote-tier tests (issue 16): redis-server processes on
loopback (ports picked by binding first, redis-server has no port 0; waited
for by condition with deadlines; stopped by PID) and waits on `flare run`
metrics.  Imported by tests/test_remote_*.py; exits 77 without
redis-server."""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import die_with_parent  # noqa: E402

BIN = os.path.join(os.environ.get("SELENE_BUILD", "build"), "flare")
REDIS = shutil.which("redis-server")
CLI = shutil.which("redis-cli")
if not REDIS or not CLI:
    print("skip: redis-server / redis-cli not installed (scripts/install-deps installs them)")
    sys.exit(77)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """One redis-server on 127.0.0.1 in a directory of its own."""

    def __init__(self, base, name, cluster=False):
        self.dir = os.path.join(base, name)
        os.makedirs(self.dir, exist_ok=True)
        self.cluster = cluster
        self.proc = None
        self.port = None
        self.extra = []

    def start(self, port=None):
        for _ in range(5):
            self.port = port or free_port()
            args = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
                    "--save", "", "--appendonly", "no", "--logfile", "redis.log"] + self.extra
            if self.cluster:
                args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                         "--cluster-node-timeout", "2000",
                         "--cluster-require-full-coverage", "no"]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self.cli("PING").strip() == "PONG":
                    return self
                time.sleep(0.02)
            self.kill()
            if port:
                break
        raise SystemExit(f"redis-server did not start in {self.dir}")

    def cli(self, *args, timeout=10):
        try:
            r = subprocess.run([CLI, "-p", str(self.port)] + list(args), capture_output=True,
                               text=True, timeout=timeout, errors="replace")
            return r.stdout
        except subprocess.TimeoutExpired:
            return ""

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


def wait_for(what, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, "timed out waiting for " + what
        time.sleep(0.02)


def reconnected(m):
    return m.get("flare_remote_reconnects_total") >= 1 and \
        m.get("flare_remote_connection_state") == 1


def ask(f, prompt, max_tokens=12):
    r = f.complete(prompt, max_tokens=max_tokens)
    return r["choices"][0]["text"], r["flare"]


def written(f, n):
    """Until f's worker is quiet (every publication offered), no copy-out or
    background write is in flight, and at least n records were written (or
    found present) on Redis."""
    def done():
        m = f.metrics()
        w = m.get("flare_remote_puts_total", result="stored") + \
            m.get("flare_remote_puts_total", result="present")
        busy = sum(m.get(k) for k in ("flare_requests_pending", "flare_requests_active",
                                       "flare_host_cache_copyout_pins",
                                       "flare_remote_writes_in_flight"))
        return w >= n and busy == 0 and m.get("flare_worker_quiet") == 1 and m
    return wait_for(f"{n} remote writes", done)
