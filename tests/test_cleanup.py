#!/usr/bin/env python3
"""Nothing is left running or lying around when a test, a scenario or a
benchmark is stopped (issue 11):

1. tests/run-tests, a test that times out: the processes of its group and
   a server it started in a session of its own (qualify/flare.py
   die_with_parent) are gone when run-tests returns, and so is run-tests'
   directory.
2. tests/run-tests interrupted (SIGTERM) while a test runs: the same.
3. A qualify/bench script (qualify/flare.py Flare and TempDir) stopped by
   SIGTERM: its flare server is stopped and its directory removed.
4. The same script SIGKILLed: its server dies with it, and the next
   TempDir of that prefix removes the directory it left.

Every wait has a deadline of seconds; processes are found by their pids
(written by the children), never by name."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = os.environ.get("SELENE_BUILD", os.path.join(src, "build"))
flare_bin = os.path.join(build, "flare")
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import TempDir, install_cleanup, wait_for  # noqa: E402

install_cleanup()
own_tmp = not os.environ.get("TEST_TMPDIR")
tmp = tempfile.mkdtemp(prefix="test_cleanup-") if own_tmp else os.environ["TEST_TMPDIR"]
run_tests = os.path.join(src, "tests", "run-tests")


def alive(pid):
    """Running (a zombie is not: it only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def read_pids(path, n, timeout=20.0):
    """The n pids a child writes to path, one per line."""
    def ready():
        try:
            with open(path) as fh:
                return len(fh.read().split()) >= n
        except OSError:
            return False
    wait_for(ready, f"{n} pids in {path}", timeout)
    with open(path) as fh:
        return [int(x) for x in fh.read().split()[:n]]


def gone(pids, what):
    wait_for(lambda: not any(alive(p) for p in pids), what)
    for p in pids:  # belt and braces, by pid: never leave one behind
        if alive(p):
            os.kill(p, signal.SIGKILL)


# A "test" that starts a process in its own group (sleep, a child of the
# shell) and one in a session of its own through die_with_parent, writes
# their pids and its own, then hangs.
HANGING = textwrap.dedent("""\
    #!/usr/bin/env python3
    import os, subprocess, sys, time
    sys.path.insert(0, {qualify!r})
    from flare import die_with_parent
    a = subprocess.Popen(["sleep", "600"])
    b = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent)
    with open({pids!r} + ".tmp", "w") as fh:
        fh.write(f"{{os.getpid()}} {{a.pid}} {{b.pid}}\\n")
    os.rename({pids!r} + ".tmp", {pids!r})
    time.sleep(600)
    """)


def hanging_test(name):
    pids = os.path.join(tmp, name + ".pids")
    path = os.path.join(tmp, name)
    with open(path, "w") as fh:
        fh.write(HANGING.format(qualify=os.path.join(src, "qualify"), pids=pids))
    os.chmod(path, 0o755)
    return path, pids


def run_tests_base():
    return os.path.join(tmp, "rt")


def rt_dirs():
    base = run_tests_base()
    return [n for n in os.listdir(base) if n.startswith("selene-tests.")] if os.path.isdir(base) \
        else []


def case_timeout():
    path, pids = hanging_test("hang_timeout")
    os.makedirs(run_tests_base(), exist_ok=True)
    env = dict(os.environ, TMPDIR=run_tests_base())
    # 8 s: time enough for the test to start its children on a loaded
    # machine (their pids are read after, and must be there).
    p = subprocess.run([run_tests, "-t", "8", path], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "timed out" in p.stdout, p.stdout + p.stderr
    got = read_pids(pids, 3, timeout=1)
    gone(got, "the timed-out test's processes")
    assert rt_dirs() == [], rt_dirs()
    print("run-tests, a test timing out: its group and its own-session child are gone")


def case_interrupt():
    path, pids = hanging_test("hang_interrupt")
    os.makedirs(run_tests_base(), exist_ok=True)
    env = dict(os.environ, TMPDIR=run_tests_base())
    rt = subprocess.Popen([run_tests, "-t", "300", path], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    got = read_pids(pids, 3)
    rt.send_signal(signal.SIGTERM)
    out, _ = rt.communicate(timeout=60)
    assert rt.returncode != 0 and "interrupted" in out, out
    gone(got, "the interrupted test's processes")
    assert rt_dirs() == [], rt_dirs()
    print("run-tests interrupted: the running test's processes and the directory are gone")


def case_leaver():
    """A test that passes but leaves a process in its group fails, and the
    process is stopped."""
    pids = os.path.join(tmp, "leaver.pids")
    path = os.path.join(tmp, "leaver")
    with open(path, "w") as fh:
        fh.write(f"#!/bin/sh\nsleep 600 &\necho $! > {pids}\nexit 0\n")
    os.chmod(path, 0o755)
    os.makedirs(run_tests_base(), exist_ok=True)
    env = dict(os.environ, TMPDIR=run_tests_base())
    p = subprocess.run([run_tests, "-t", "60", path], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "left processes running" in p.stdout, p.stdout + p.stderr
    gone(read_pids(pids, 1, timeout=1), "the process the passing test left")
    print("run-tests: a passing test that leaves a process running fails, the process stopped")


# A scenario script: a TempDir and a flare server in it, then it hangs.
SCRIPT = textwrap.dedent("""\
    import os, sys, time
    sys.path.insert(0, {qualify!r})
    from flare import Flare, TempDir, install_cleanup
    install_cleanup()
    with TempDir("flare-cleanup-test-", {base!r}) as d:
        with Flare({flare!r}, ["--prefix-cache-memory", "16MiB", "--prefix-cache-disk",
                               os.path.join(d, "cache")]) as f:
            with open({pids!r} + ".tmp", "w") as fh:
                fh.write(f"{{os.getpid()}} {{f.proc.pid}}\\n{{d}}\\n")
            os.rename({pids!r} + ".tmp", {pids!r})
            time.sleep(600)
    """)


def start_script(name):
    pids = os.path.join(tmp, name + ".pids")
    base = os.path.join(tmp, name + "-base")
    os.makedirs(base, exist_ok=True)
    code = SCRIPT.format(qualify=os.path.join(src, "qualify"), base=base, flare=flare_bin,
                         pids=pids)
    p = subprocess.Popen([sys.executable, "-c", code])
    got = read_pids(pids, 2, timeout=60)
    with open(pids) as fh:
        d = fh.read().split("\n")[1]
    assert os.path.isdir(d) and alive(got[1])
    return p, got, base, d


def case_script_sigterm():
    p, got, base, d = start_script("sigterm")
    p.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=90)
    assert rc == 128 + signal.SIGTERM, rc
    gone(got, "the script and its server after SIGTERM")
    assert not os.path.exists(d), f"{d} left behind"
    print("a scenario script stopped by SIGTERM: server stopped, directory removed")


def case_script_sigkill():
    p, got, base, d = start_script("sigkill")
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    gone([got[1]], "the server of a SIGKILLed script")
    assert os.path.isdir(d), "the directory went without a reaper?"
    t = TempDir("flare-cleanup-test-", base)  # the next run's TempDir reaps it
    try:
        assert not os.path.exists(d), f"{d} not reaped"
        assert os.path.isdir(t.path)
    finally:
        t.cleanup()
    print("a scenario script SIGKILLed: its server died with it, the next TempDir reaped "
          "its directory")


if not os.access(flare_bin, os.X_OK):
    print(f"skip: no flare binary at {flare_bin}")
    sys.exit(77)
case_timeout()
case_interrupt()
case_leaver()
case_script_sigterm()
case_script_sigkill()
for n in os.listdir(tmp):  # what the cases wrote
    p = os.path.join(tmp, n)
    if os.path.isdir(p):
        shutil.rmtree(p, ignore_errors=True)
    else:
        os.unlink(p)
if own_tmp:
    os.rmdir(tmp)
print("ok")
