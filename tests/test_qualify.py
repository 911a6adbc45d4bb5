#!/usr/bin/env python3
"""The qualification scenarios of the host prefix cache (design 4, steps 11
and 12) at small sizes: qualify/host_cache.py --quick against
$SELENE_BUILD/flare.  Scenarios that need the disk store skip (and say so)
while the build has none; a failing scenario fails this test.  `make
qualify` runs the full sizes."""
import os
import subprocess
import sys

src = os.environ.get("SELENE_SRCDIR", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = os.environ.get("SELENE_BUILD", os.path.join(src, "build"))
flare = os.path.join(build, "flare")
if not os.access(flare, os.X_OK):
    print(f"skip: no flare binary at {flare}")
    sys.exit(77)
rc = subprocess.call([sys.executable, os.path.join(src, "qualify", "host_cache.py"),
                      "--flare", flare, "--quick"])
sys.exit(0 if rc == 0 else 1)
