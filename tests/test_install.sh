#!/bin/sh
# make install (PREFIX, DESTDIR) gives a usable library: the header, the
# static and shared libraries and selene.pc let a program build and run.
set -eu
case "$SELENE_BUILD" in
*/asan|*/tsan) echo "skip: sanitizer builds install instrumented libraries"; exit 77 ;;
esac
root="$TEST_TMPDIR/root"
make -s -C "$SELENE_SRCDIR" BUILD="$SELENE_BUILD" install DESTDIR="$root" PREFIX=/opt/selene >/dev/null
for f in include/selene.h lib/libselene.a lib/libselene.so lib/pkgconfig/selene.pc bin/flare; do
	test -e "$root/opt/selene/$f" || { echo "missing $f"; exit 1; }
done
cat > "$TEST_TMPDIR/app.c" <<'C'
#include <selene.h>
#include <stdio.h>
int main(void)
{
	uint8_t model[SEL_IDENTITY_BYTES] = {0}, id[SEL_IDENTITY_BYTES];
	char hex[65];
	sel_offload_identity(model, SEL_MODE_ORDINARY, id);
	puts(sel_hex(id, sizeof id, hex));
	return 0;
}
C
want=56fba6211096b21fe87e04f4a00e4d387dc46da520c4ca7d0f07ac1edb9847ef
flags=$(PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_PATH="$root/opt/selene/lib/pkgconfig" pkg-config --cflags --libs selene)
cc -std=gnu11 "$TEST_TMPDIR/app.c" $flags -o "$TEST_TMPDIR/app-shared"
test "$(LD_LIBRARY_PATH="$root/opt/selene/lib" "$TEST_TMPDIR/app-shared")" = "$want"
flags=$(PKG_CONFIG_SYSROOT_DIR="$root" PKG_CONFIG_PATH="$root/opt/selene/lib/pkgconfig" pkg-config --static --cflags --libs selene)
cc -std=gnu11 "$TEST_TMPDIR/app.c" "$root/opt/selene/lib/libselene.a" $flags -o "$TEST_TMPDIR/app-static"
test "$("$TEST_TMPDIR/app-static")" = "$want"
rm -rf "$root" "$TEST_TMPDIR"/app*
echo ok
