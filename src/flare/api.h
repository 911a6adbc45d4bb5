/*
 * api.h - the OpenAI-compatible request and response bodies of `flare run`
 * (POST /v1/completions, POST /v1/chat/completions; docs/configuration.md
 * "HTTP API").
 *
 * Pure code: JSON text in, a validated request out; an outcome in, JSON
 * text out.  The HTTP glue (server.c) does the I/O and the fuzzer
 * (fuzz/fuzz_api.c) calls flare_api_parse directly.
 */
#ifndef FLARE_API_H
#define FLARE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "flare/buf.h"
#include "helios/engine.h"

enum flare_api_kind {
	FLARE_API_COMPLETIONS = 0, /* prompt -> text */
	FLARE_API_CHAT,            /* messages -> message (chat template) */
};

#define FLARE_API_DEFAULT_MAX_TOKENS 16
#define FLARE_API_SALT_MAX 1024

struct flare_api_limits {
	const char *model;           /* the core's name: a given "model" must equal it */
	uint32_t vocab;              /* token ids of an array prompt must be below it */
	uint64_t max_context;        /* prompt + max_tokens must fit */
	uint32_t default_max_tokens; /* 0: FLARE_API_DEFAULT_MAX_TOKENS */
};

/* A validated request, ready for hel_engine_submit. */
struct flare_api_request {
	enum flare_api_kind kind;
	hel_token *prompt;       /* malloc'd */
	uint32_t n_prompt;
	uint32_t max_tokens;     /* >= 1, prompt + max_tokens <= max_context */
	hel_sampler sampler;     /* temperature default 1.0 */
	bool seed_set;           /* false: the caller picks a seed */
	bool stream;
	bool include_usage;      /* stream_options.include_usage */
	bool ignore_eos;         /* generate max_tokens, past the end token (vLLM's extension) */
	char *salt;              /* cache_salt, else user; NULL = none (malloc'd) */
	size_t salt_len;
};

/* What the client did wrong, as an HTTP status and an OpenAI error body. */
struct flare_api_error {
	unsigned status;         /* 400, 404, 413, 503, ... */
	const char *type;        /* "invalid_request_error", "server_error" */
	const char *code;        /* NULL, "model_not_found", "context_length_exceeded" */
	char param[96];          /* the field at fault ("max_tokens", "messages[1].role"), "" */
	char message[512];
};

/* Parse and validate body[0..len).  0 with *out filled (free with
 * flare_api_request_free), or -EINVAL with *err filled and *out empty. */
int flare_api_parse(enum flare_api_kind kind, const char *body, size_t len,
		    const struct flare_api_limits *lim, struct flare_api_request *out,
		    struct flare_api_error *err);
void flare_api_request_free(struct flare_api_request *r);

void flare_api_error_set(struct flare_api_error *e, unsigned status, const char *type,
			 const char *param, const char *code, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));
/* {"error":{"message":..., "type":..., "param":... | null, "code":... | null}} */
void flare_api_error_json(struct flare_buf *out, const struct flare_api_error *e);

/* ---- responses ------------------------------------------------------------ */

struct flare_api_meta {
	enum flare_api_kind kind;
	char id[48];             /* "cmpl-..." / "chatcmpl-..." */
	int64_t created;         /* Unix seconds */
	const char *model;
	bool include_usage;      /* streams: usage: null on chunks, then a usage chunk */
};

/* Valid UTF-8 of in[0..n) into out, each invalid byte replaced by U+FFFD.
 * Unless final, an incomplete sequence at the end is left unconsumed (it
 * may complete with the next tokens).  Returns the bytes consumed. */
size_t flare_utf8_clean(const char *in, size_t n, bool final, struct flare_buf *out);

/* "none", "gpu", "memory", "disk" or "pool": where the deepest reuse of the
 * request's prompt came from. */
const char *flare_api_source(const hel_outcome *o);

/* The whole (non-streamed) response; text must be valid UTF-8. */
void flare_api_response(struct flare_buf *out, const struct flare_api_meta *m, const char *text,
			size_t len, const hel_outcome *o);

/* Server-sent events, each "data: {...}\n\n".  Chat streams start with
 * the role chunk; every stream ends with the finish chunk, the usage chunk
 * (include_usage), and done. */
void flare_api_sse_role(struct flare_buf *out, const struct flare_api_meta *m);
void flare_api_sse_text(struct flare_buf *out, const struct flare_api_meta *m, const char *text,
			size_t len);
void flare_api_sse_finish(struct flare_buf *out, const struct flare_api_meta *m,
			  const hel_outcome *o);
void flare_api_sse_usage(struct flare_buf *out, const struct flare_api_meta *m,
			 const hel_outcome *o);
void flare_api_sse_error(struct flare_buf *out, const struct flare_api_error *e);
void flare_api_sse_done(struct flare_buf *out);

#endif
