/*
 * stop.h - stop sequences (the OpenAI API's `stop`): matched on the
 * detokenized text as it grows, across token boundaries.
 *
 * Pure code, any thread.  The caller keeps the generated text and, after
 * each token's bytes are appended, asks whether a stop sequence now ends
 * in it (flare_stop_find) and, if not, how many bytes at its end could be
 * the start of one and must be held back from a stream
 * (flare_stop_holdback).  Feeding tokens one at a time is what makes
 * several tokens accepted in one step (speculative decoding) stop at the
 * right one.
 */
#ifndef FLARE_STOP_H
#define FLARE_STOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FLARE_STOP_MAX 4     /* sequences per request (OpenAI's bound) */
#define FLARE_STOP_BYTES 256 /* bytes per sequence */

struct flare_stop {
	uint32_t n;
	uint32_t len[FLARE_STOP_MAX]; /* each >= 1 */
	char s[FLARE_STOP_MAX][FLARE_STOP_BYTES];
};

/* Add one sequence (1..FLARE_STOP_BYTES bytes, any bytes); -EINVAL when
 * full or of a bad length. */
int flare_stop_add(struct flare_stop *st, const char *s, size_t len);

/* A sequence ending in text[0..len) after its first `before` bytes (the
 * text already checked): true with *at = where the earliest such
 * occurrence starts (the text is cut there).  Occurrences that ended
 * within text[0..before) are not looked for: they were found then. */
bool flare_stop_find(const struct flare_stop *st, const char *text, size_t len, size_t before,
		     size_t *at);

/* The longest suffix of text[0..len) that is a proper prefix of a
 * sequence: bytes a stream must not send yet.  0 without sequences. */
size_t flare_stop_holdback(const struct flare_stop *st, const char *text, size_t len);

#endif
