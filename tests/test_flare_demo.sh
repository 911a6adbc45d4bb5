#!/bin/sh
# The README's main command must work: `flare run` exits 0 and says ok.
set -eu
out=$("$SELENE_BUILD/flare" run)
echo "$out"
echo "$out" | tail -n 1 | grep -qx ok
