/*
 * stop.c - stop sequences matched on generated text (stop.h; the
 * OpenAI API's `stop`, docs/configuration.md).
 *
 * DESIGN
 * Plain substring search over the bytes that can hold a new occurrence:
 * one that ends after `before` starts at most (longest - 1) bytes before
 * it.  Sequences are at most 4 x 256 bytes, so the work per token is
 * bounded by a few thousand byte comparisons, whatever the text's length.
 *
 * Invariants:
 *   1. flare_stop_find reports the earliest start among the occurrences
 *      that end after `before`; with every token checked as it arrives,
 *      that is the first occurrence in the text.
 *   2. holdback < the longest sequence, and text[0..len - holdback) holds
 *      no byte that a later token could turn into the start of a match.
 */
#include "flare/stop.h"

#include <errno.h>
#include <string.h>

int flare_stop_add(struct flare_stop *st, const char *s, size_t len)
{
	if (st->n >= FLARE_STOP_MAX || len == 0 || len > FLARE_STOP_BYTES)
		return -EINVAL;
	memcpy(st->s[st->n], s, len);
	st->len[st->n] = (uint32_t)len;
	st->n++;
	return 0;
}

bool flare_stop_find(const struct flare_stop *st, const char *text, size_t len, size_t before,
		     size_t *at)
{
	bool found = false;
	size_t best = 0;
	for (uint32_t k = 0; k < st->n; k++) {
		size_t l = st->len[k];
		if (l > len)
			continue;
		/* Starts whose occurrence ends after before: i + l > before. */
		size_t i = before >= l ? before - l + 1 : 0;
		for (; i + l <= len && (!found || i < best); i++)
			if (text[i] == st->s[k][0] && !memcmp(text + i, st->s[k], l)) {
				found = true;
				best = i;
				break;
			}
	}
	if (found)
		*at = best;
	return found;
}

size_t flare_stop_holdback(const struct flare_stop *st, const char *text, size_t len)
{
	size_t hold = 0;
	for (uint32_t k = 0; k < st->n; k++) {
		size_t l = st->len[k];
		for (size_t h = (l - 1 < len ? l - 1 : len); h > hold; h--)
			if (!memcmp(text + len - h, st->s[k], h)) {
				hold = h;
				break;
			}
	}
	return hold;
}
