#!/usr/bin/env python3
"""README.md stays true to the program: its two set-up commands are
there, in fenced blocks after "Main job:" and "Tests:" (scripts/check-fresh
runs exactly those), and its sample startup lines are what `flare run`
prints for the main job's flags today, line for line -- numbers, sizes,
the port and the namespace directory aside (they depend on the machine)."""
import os
import re
import shutil
import subprocess
import sys
import time

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = os.environ.get("SELENE_BUILD", os.path.join(src, "build"))
sys.path.insert(0, os.path.join(src, "qualify"))
from flare import die_with_parent, install_cleanup  # noqa: E402

install_cleanup()
tmp = os.environ.get("TEST_TMPDIR", "/tmp")
readme = open(os.path.join(src, "README.md")).read()


def block_after(marker):
    pat = r"\s+".join(re.escape(w) for w in marker.split())
    m = re.search(pat + r"\s*\n+```\w*\n(.*?)```", readme, re.S)
    assert m, f"README.md: no fenced block after {marker!r}"
    return m.group(1).strip()


main_job = block_after("Main job:")
tests = block_after("Tests:")
assert main_job.startswith("make && build/flare run "), main_job
assert tests == "make check", tests
print("README commands:", main_job, "|", tests)

sample = block_after("The startup lines say what was selected:").splitlines()
assert len(sample) == 3 and all(l.startswith("flare: ") for l in sample), sample


def shape(line):
    """The line with what depends on the machine masked: the namespace
    directory, sizes with their unit, then every number."""
    line = re.sub(r"directory \S+?,", "directory DIR,", line)
    line = re.sub(r"\d+(\.\d+)? (B|KiB|MiB|GiB|TiB)\b", "SIZE", line)
    return re.sub(r"\d+(\.\d+)?", "#", line)


# The main job's flags, the disk directory in this test's directory, a
# free port; the memory size masks like any number.
args = main_job.split("build/flare run ", 1)[1].split()
args = [os.path.join(tmp, "prefix-cache") if a == "build/prefix-cache" else a for a in args]
args = ["64MiB" if a == "1GiB" else a for a in args]
cmd = [os.path.join(build, "flare"), "run", "--port", "0", "--dashboard", "off"] + args
proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
got = []
deadline = time.monotonic() + 60
try:
    while len(got) < 3 and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if line.startswith("flare: "):
            got.append(line.rstrip("\n"))
finally:
    proc.terminate()
    proc.communicate(timeout=60)
    shutil.rmtree(os.path.join(tmp, "prefix-cache"), ignore_errors=True)
assert len(got) == 3, got
for want, have in zip(sample, got):
    if shape(want) != shape(have):
        sys.exit(f"README.md startup line differs from the program's:\n  README: {want}\n"
                 f"  flare:  {have}")
print("README startup lines match:", *got, sep="\n  ")
print("ok")
