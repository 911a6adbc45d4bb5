#!/bin/sh
# examples/engine.c, an engine that is not ours, builds against an
# installed copy of the library alone -- the header, the shared library and
# pkg-config, nothing from the source tree -- and restores its checkpoints
# byte-exact through the memory store and the composite (docs/integration.md).
set -eu
case "$SELENE_BUILD" in
*/asan|*/tsan) echo "skip: sanitizer builds install instrumented libraries"; exit 77 ;;
esac
root="$TEST_TMPDIR/root"
make -s -C "$SELENE_SRCDIR" BUILD="$SELENE_BUILD" install DESTDIR="$root" PREFIX=/opt/selene >/dev/null
test -e "$root/opt/selene/include/selene_store.h" || { echo "selene_store.h not installed"; exit 1; }
pc="PKG_CONFIG_SYSROOT_DIR=$root PKG_CONFIG_PATH=$root/opt/selene/lib/pkgconfig"
flags=$(env $pc pkg-config --cflags --libs selene)
test "$(env $pc pkg-config --modversion selene)" = "$(sed -n 's/^#define SEL_VERSION_STRING "\(.*\)"/\1/p' "$SELENE_SRCDIR/include/selene.h")"
# A copy outside the tree, so no include path can reach src/.
cp "$SELENE_SRCDIR/examples/engine.c" "$TEST_TMPDIR/engine.c"
cc -std=gnu11 -Wall -Wextra -Werror "$TEST_TMPDIR/engine.c" $flags -o "$TEST_TMPDIR/engine"
out=$(LD_LIBRARY_PATH="$root/opt/selene/lib" "$TEST_TMPDIR/engine")
printf '%s\n' "$out"
printf '%s\n' "$out" | grep -q '^ok$'
printf '%s\n' "$out" | grep -q 'from nvme'
rm -rf "$root" "$TEST_TMPDIR"/engine*
