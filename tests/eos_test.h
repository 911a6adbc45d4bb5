/*
 * eos_test.h - what the Eos tests share on top of testutil.h.
 *
 * Eos sits below libselene, and its tests must build and link whether or
 * not the selene error table (sel_strerror, sel_errmsg) exists yet.  The
 * harness macros report failures through those two names; here they are
 * pointed at libc's strerror and Eos's own message, which is the message a
 * failing Eos call leaves in any case.
 */
#ifndef EOS_TEST_H
#define EOS_TEST_H

#include "testutil.h"
#include "eos.h"

#undef sel_strerror
#undef sel_errmsg
#define sel_strerror(rc) strerror(-(rc))
#define sel_errmsg() eos_errmsg()

/* The message of the last failure must contain needle. */
#define CHECK_MSG(needle)                                                                     \
	CHECKF(strstr(eos_errmsg(), (needle)) != NULL, "message '%s' lacks '%s'", eos_errmsg(), \
	       (needle))

#endif
