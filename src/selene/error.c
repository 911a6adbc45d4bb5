/*
 * error.c - error codes and messages of libselene (STYLE.md 6).
 *
 * Functions return 0 or a negative errno, or one of our SEL_E* codes which
 * live in a reserved range below -30800.  sel_strerror() names either;
 * sel_errmsg() returns the calling thread's detailed message, kept by Eos
 * (eos_fail) so Eos and Selene share one buffer per thread.
 */
#include <string.h>

#include "eos.h"
#include "selene.h"

static const char *const sel_codes[] = {
	[SEL_EBASE - SEL_ECORRUPT] = "stored bytes failed verification",
	[SEL_EBASE - SEL_EIDENTITY] = "record belongs to another model or state mode",
	[SEL_EBASE - SEL_ELAYOUT] = "record has another layout fingerprint",
	[SEL_EBASE - SEL_EGEOMETRY] = "allocations do not form a valid cache geometry",
	[SEL_EBASE - SEL_ECUDA] = "cuda unavailable or failed",
	[SEL_EBASE - SEL_EOVERSIZE] = "larger than the tier can ever hold",
	[SEL_EBASE - SEL_EFORMAT] = "malformed header, name or text",
	[SEL_EBASE - SEL_ESTOPPED] = "store stopped after an unreportable transfer failure",
	[SEL_EBASE - SEL_EDIRECTORY] = "record directory unusable",
};

const char *sel_strerror(int rc)
{
	if (rc >= 0)
		return "success";
	if (rc <= SEL_EBASE && rc > SEL_ELAST) {
		const char *s = sel_codes[SEL_EBASE - rc];
		return s ? s : "unknown selene error";
	}
	if (rc > SEL_EBASE && rc > -4096)
		return strerror(-rc);
	return "unknown error";
}

const char *sel_errmsg(void) { return eos_errmsg(); }
