"""ranks.py - a multi-host core as one `flare run` process per rank, on this
host (docs/multihost.md "Execution"; design 2.14).

Standard library only, on top of flare.py.  Rank 0 is an ordinary Flare
(HTTP, metrics) started with ``--ranks N --rank 0 --rendezvous
127.0.0.1:0``; its "rendezvous on ADDR" line gives the address the peers
(``--rank 1..N-1``) join.  Every process dies with the script.

    with Ranks(binary, "cores/qwen-tp2-small.core", 2) as g:
        print(g.lead.complete("hello", max_tokens=8))
"""
import os
import re
import subprocess
import threading
import time

from flare import Flare, FlareError, die_with_parent  # noqa: F401

START_TIMEOUT = 60.0


class _Lead(Flare):
    """Rank 0: a Flare whose command may run under a prefix (ip netns exec
    NS) and whose HTTP address may be another than 127.0.0.1."""

    def __init__(self, *a, prefix=(), host=None, **kw):
        super().__init__(*a, **kw)
        self.prefix, self.host = list(prefix), host

    def command(self):
        return self.prefix + super().command()

    def wait_started(self):
        super().wait_started()
        if self.host:
            self.base = f"http://{self.host}:{self.port}"
        return self


class Peer:
    """A rank > 0: no HTTP; its stderr drained on a thread."""

    def __init__(self, binary, core, world, rank, addr, args=(), log=None, prefix=(), env=None):
        self.rank = rank
        self.cmd = list(prefix) + [binary, "run", "--dashboard", "off", "--ranks", str(world), "--rank", str(rank),
                    "--rendezvous", addr] + list(args) + [core]
        if log:
            log("$ " + " ".join(self.cmd))
        self.lines = []
        self._lock = threading.Lock()
        self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, errors="replace",
                                     env=env, preexec_fn=die_with_parent)
        self._drain = threading.Thread(target=self._read, daemon=True)
        self._drain.start()

    def _read(self):
        for line in self.proc.stderr:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def tail(self, n=10):
        with self._lock:
            return "\n".join(self.lines[-n:])

    def wait(self, timeout=30.0):
        """The exit status (killed after the timeout: FlareError)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise FlareError(f"rank {self.rank} did not exit within {timeout:.0f}s: " + self.tail())
        self._drain.join(5)
        return rc

    def kill(self, sig=9):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)


class Ranks:
    """Rank 0 (self.lead, a Flare) and its peers (self.peers).  args go to
    every rank; rank_args[r] to rank r only (e.g. another core)."""

    def __init__(self, binary, core, world, args=(), rank_args=None, cores=None, log=None,
                 start_timeout=START_TIMEOUT, prefix=None, host=None, rendezvous="127.0.0.1:0",
                 env=None):
        """prefix[r]: what runs rank r's command (e.g. ip netns exec NS);
        host: rank 0's HTTP address (--host); rendezvous: where it listens;
        env[r]: variables added to rank r's environment (test knobs)."""
        self.env = env or {}
        self.prefix = prefix or {}
        self.host = host
        self.rendezvous = rendezvous
        self.binary, self.core, self.world = binary, core, world
        self.args = list(args)
        self.rank_args = rank_args or {}
        self.cores = cores or {}
        self.log = log
        self.start_timeout = start_timeout
        self.lead = None
        self.peers = []
        self.addr = None

    def start(self):
        lead_args = self.args + list(self.rank_args.get(0, [])) + [
            "--ranks", str(self.world), "--rank", "0", "--rendezvous", self.rendezvous]
        if self.host:
            lead_args += ["--host", self.host]
        self.lead = _Lead(self.binary, lead_args, core=self.cores.get(0, self.core), name="rank 0",
                          start_timeout=self.start_timeout, log=self.log,
                          prefix=self.prefix.get(0, ()), host=self.host, env=self._env(0))
        self.lead.start(wait=False)
        deadline = time.monotonic() + self.start_timeout
        while self.addr is None and time.monotonic() < deadline and self.lead.proc.poll() is None:
            with self.lead._lock:
                for line in self.lead.lines:
                    m = re.search(r"rendezvous on (\S+);", line)
                    if m:
                        self.addr = m.group(1)
            if self.addr is None:
                time.sleep(0.02)
        if self.addr is None:
            time.sleep(0.2)  # its last lines
            raise FlareError("rank 0 printed no rendezvous address: " + self.lead.stderr_tail())
        for r in range(1, self.world):
            self.peers.append(Peer(self.binary, self.cores.get(r, self.core), self.world, r,
                                   self.addr, self.args + list(self.rank_args.get(r, [])),
                                   self.log, self.prefix.get(r, ()), self._env(r)))
        try:
            self.lead.wait_started()
        except FlareError as e:
            for p in self.peers:
                try:
                    p.wait(10)
                except FlareError:
                    pass
            raise FlareError(str(e) + "\n" + "\n".join(p.tail() for p in self.peers))
        return self

    def _env(self, r):
        if r not in self.env:
            return None
        e = dict(os.environ)
        e.update(self.env[r])
        return e

    def stop(self, check=True):
        """SIGTERM to rank 0; every peer then exits after its BYE.  Returns
        (rank 0's status, [peer statuses])."""
        rc = self.lead.stop(check=check) if self.lead else None
        prc = [p.wait() for p in self.peers]
        if check and any(prc):
            raise FlareError(f"peers exited {prc}: " + "\n".join(p.tail() for p in self.peers))
        return rc, prc

    def kill_all(self):
        for p in self.peers:
            p.kill()
        if self.lead:
            self.lead.kill()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.kill_all()
            raise

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.stop()
        else:
            self.kill_all()
        return False
