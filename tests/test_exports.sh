#!/bin/sh
# libselene.so exports exactly the calls include/selene.h declares (the
# version script src/selene/libselene.map, local: *), and the map names
# every one of them: nothing internal (sel_index_*, sel_disk_store_*,
# eos_*) leaks into the shared library's ABI.
set -eu
case "$SELENE_BUILD" in
*/asan|*/tsan) echo "skip: sanitizer builds link their runtimes into the library"; exit 77 ;;
esac
lib="$SELENE_BUILD/libselene.so"
test -e "$lib" || { echo "no $lib"; exit 1; }
# Declared calls: identifiers followed by '(' outside comments and static
# inline definitions.
declared=$(sed -e 's:/\*.*\*/::g' "$SELENE_SRCDIR/include/selene.h" |
	awk '/\/\*/{c=1} !c && !/^static/ {print} /\*\//{c=0}' |
	grep -oE '\bsel_[a-z0-9_]+[[:space:]]*\(' | tr -d '( \t' | sort -u)
exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sort -u)
if [ "$declared" != "$exported" ]; then
	echo "libselene.so exports and include/selene.h declares differ:"
	printf '%s\n' "$declared" >"$TEST_TMPDIR/declared"
	printf '%s\n' "$exported" >"$TEST_TMPDIR/exported"
	diff "$TEST_TMPDIR/declared" "$TEST_TMPDIR/exported" || true
	exit 1
fi
echo "ok: $(printf '%s\n' "$exported" | wc -l) symbols, all declared in selene.h"
