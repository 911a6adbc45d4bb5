/*
 * tokenizer.h - the reference engine's byte-level tokenizer and chat
 * template (ARCHITECTURE.md "The reference engine's model").
 *
 * Tokens 0..255 are bytes, so any text is a valid prompt; HEL_TOK_BEGIN,
 * HEL_TOK_END and HEL_TOK_MESSAGE (core.h) are the specials.  The chat
 * template ends every message with a MESSAGE token, so message boundaries
 * are where the scheduler checkpoints (design 2.2), and it is prefix-stable:
 * the prompt of a conversation's next turn begins with the previous turn's
 * prompt followed by the reply.  Pure functions, any thread.
 */
#ifndef HEL_TOKENIZER_H
#define HEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

/* One token per byte of text[0..len) into out (len entries).  Returns len. */
size_t hel_tokenize(const char *text, size_t len, hel_token *out);

/* The bytes of tokens[0..n) into out: specials and reserved ids (>= 259)
 * produce nothing.  Like snprintf: writes at most cap - 1 bytes and a NUL
 * (when cap > 0) and returns the full byte count. */
size_t hel_detokenize(const hel_token *tokens, size_t n, char *out, size_t cap);

/* An image inside a message's content: before content byte `offset` (in
 * order, offsets ascending), `tokens` HEL_TOK_IMAGE positions. */
typedef struct hel_message_image {
	size_t offset;
	uint32_t tokens;
} hel_message_image;

typedef struct hel_message {
	const char *role;    /* "system", "user", "assistant", ...: NUL-terminated */
	const char *content; /* content_len bytes (may hold NULs) */
	size_t content_len;
	const hel_message_image *images; /* NULL when n_images is 0 */
	size_t n_images;
} hel_message;

/* BEGIN, then for each message `role ": " content MESSAGE` (content with
 * each image's HEL_TOK_IMAGE positions where its part stood), then, with
 * generation_prompt, `"assistant: "` for the reply to follow.  Writes at
 * most cap tokens to out and returns the full count (call with cap 0 to
 * size the buffer). */
size_t hel_chat_template(const hel_message *msgs, size_t n, bool generation_prompt, hel_token *out,
			 size_t cap);

#endif
