/*
 * fuzz_core.c - libFuzzer target over the core parser (STYLE 13).
 *
 * Any input either fails with SEL_EFORMAT and a message naming the file and
 * a line, or parses into a core whose canonical text parses again to the
 * same canonical text and identity, and whose row layouts are consistent.
 * Corpus: fuzz/corpus/core/ (replayed by build/fuzz/replay_core in make
 * check).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helios/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	hel_core *c = NULL, *c2 = NULL;
	char err[256];
	int rc = hel_core_parse((const char *)data, size, "fuzz.core", &c, err, sizeof err);
	if (rc) {
		if (c || (rc != SEL_EFORMAT && rc != -ENOMEM) ||
		    strncmp(err, "fuzz.core:", 10) != 0)
			abort();
		return 0;
	}
	if (hel_core_parse(c->canonical, c->canonical_len, "canonical", &c2, err, sizeof err))
		abort();
	if (c2->canonical_len != c->canonical_len ||
	    memcmp(c2->canonical, c->canonical, c->canonical_len) != 0 ||
	    memcmp(c2->identity, c->identity, sizeof c->identity) != 0)
		abort();
	for (int m = 0; m < 3; m++) {
		hel_row_layout lay;
		if (!hel_core_supports(c, (sel_state_mode)m))
			continue;
		if (hel_core_row_layout(c, (sel_state_mode)m, &lay) || lay.bytes % 8 ||
		    lay.bytes > HEL_ROW_MAX + 4096 ||
		    lay.draft_partial + lay.draft_partial_bytes != lay.bytes)
			abort();
	}
	hel_core_free(c2);
	hel_core_free(c);
	return 0;
}
