/*
 * err.c - the calling thread's last error message (eos_fail, eos_errmsg).
 *
 * Every Eos and Selene call that fails returns a negative errno and leaves a
 * one-line explanation here for the caller to show ("size '8X': unknown unit
 * 'X' ...").  Return codes say what kind of failure; the message says which
 * value and what was expected (eos.h "Conventions").
 *
 * DESIGN
 *   One fixed buffer per thread, no allocation, so failing for lack of memory
 *   can still explain itself.  A message may quote the previous one
 *   (eos_fail(rc, "open: %s", eos_errmsg())): it is formatted into a scratch
 *   buffer on the stack first and then copied, so source and destination
 *   never overlap.  errno is preserved across eos_fail so a caller may still
 *   read it afterwards.
 *
 * INVARIANTS
 *   1. msg is always NUL-terminated and holds at most EOS_ERRMSG_MAX - 1
 *      bytes; a cut never splits a UTF-8 sequence.
 *   2. Only the owning thread reads or writes its msg.
 */
#include "eos.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* eos.h's analyzer-only macros stand for these functions elsewhere. */
#undef eos_fail
#undef eos_vfail

static __thread char msg[EOS_ERRMSG_MAX];

const char *eos_errmsg(void) { return msg; }

void eos_errclear(void) { msg[0] = '\0'; }

/* s holds len bytes of a longer text cut there (s[len] is the NUL).  Drop a
 * trailing multibyte UTF-8 sequence that the cut left incomplete. */
static void utf8_cut(char *s, size_t len)
{
	size_t start = len;
	while (start > 0 && ((unsigned char)s[start - 1] & 0xc0) == 0x80)
		start--;
	if (start == 0)
		return; /* no lead byte at all: not UTF-8, leave it */
	unsigned char lead = (unsigned char)s[start - 1];
	size_t need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
	if ((start - 1) + need > len)
		s[start - 1] = '\0';
}

int eos_vfail(int rc, const char *fmt, va_list ap)
{
	int saved = errno;
	char tmp[EOS_ERRMSG_MAX];
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	if (n < 0) {
		snprintf(tmp, sizeof tmp, "(unformattable message for error %d)", rc);
	} else if ((size_t)n >= sizeof tmp) {
		utf8_cut(tmp, sizeof tmp - 1);
	}
	memcpy(msg, tmp, sizeof msg);
	errno = saved;
	return rc;
}

int eos_fail(int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	eos_vfail(rc, fmt, ap);
	va_end(ap);
	return rc;
}
