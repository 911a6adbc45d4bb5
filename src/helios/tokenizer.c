/*
 * tokenizer.c - byte-level tokenizer and chat template (see tokenizer.h).
 *
 * DESIGN
 *   A token per byte keeps every text valid and every prefix a prefix.  The
 *   template's only structure is the MESSAGE boundary after each message,
 *   which is where the scheduler offers checkpoints.
 *
 * INVARIANTS
 *   1. detokenize(tokenize(s)) == s for every byte string s.
 *   2. template(msgs[0..k), generation prompt) followed by the tokens of the
 *      reply and MESSAGE is a prefix of template(msgs[0..k] + that reply).
 */
#include <string.h>

#include "tokenizer.h"

#define ASSISTANT "assistant"

size_t hel_tokenize(const char *text, size_t len, hel_token *out)
{
	for (size_t i = 0; i < len; i++)
		out[i] = (unsigned char)text[i];
	return len;
}

size_t hel_detokenize(const hel_token *tokens, size_t n, char *out, size_t cap)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (tokens[i] > 255)
			continue;
		if (k + 1 < cap)
			out[k] = (char)tokens[i];
		k++;
	}
	if (cap)
		out[k < cap ? k : cap - 1] = 0;
	return k;
}

static void put(hel_token *out, size_t cap, size_t *k, hel_token t)
{
	if (*k < cap)
		out[*k] = t;
	(*k)++;
}

static void put_bytes(hel_token *out, size_t cap, size_t *k, const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		put(out, cap, k, (unsigned char)s[i]);
}

size_t hel_chat_template(const hel_message *msgs, size_t n, bool generation_prompt, hel_token *out,
			 size_t cap)
{
	size_t k = 0;
	put(out, cap, &k, HEL_TOK_BEGIN);
	for (size_t i = 0; i < n; i++) {
		put_bytes(out, cap, &k, msgs[i].role, strlen(msgs[i].role));
		put_bytes(out, cap, &k, ": ", 2);
		size_t at = 0;
		for (size_t j = 0; j < msgs[i].n_images; j++) {
			size_t off = msgs[i].images[j].offset;
			off = off < at ? at : off > msgs[i].content_len ? msgs[i].content_len : off;
			put_bytes(out, cap, &k, msgs[i].content + at, off - at);
			for (uint32_t t = 0; t < msgs[i].images[j].tokens; t++)
				put(out, cap, &k, HEL_TOK_IMAGE);
			at = off;
		}
		put_bytes(out, cap, &k, msgs[i].content + at, msgs[i].content_len - at);
		put(out, cap, &k, HEL_TOK_MESSAGE);
	}
	if (generation_prompt) {
		put_bytes(out, cap, &k, ASSISTANT, strlen(ASSISTANT));
		put_bytes(out, cap, &k, ": ", 2);
	}
	return k;
}
