/*
 * eos_test.h - what the Eos tests share on top of testutil.h.
 */
#ifndef EOS_TEST_H
#define EOS_TEST_H

#include "testutil.h"
#include "eos.h"

/* The message of the last failure must contain needle. */
#define CHECK_MSG(needle)                                                                          \
	CHECKF(strstr(eos_errmsg(), (needle)) != NULL, "message '%s' lacks '%s'", eos_errmsg(),    \
	       (needle))

#endif
