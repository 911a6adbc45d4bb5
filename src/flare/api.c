/*
 * api.c - request validation and response bodies of the OpenAI-compatible
 * API (docs/configuration.md "HTTP API"; design 2.11 metrics, 4 "prefill
 * launches limited to the new tokens" through the "flare" object).
 *
 * DESIGN
 * jansson parses; this file decides what a field may hold and says which
 * field was wrong.  Fields we do not know are ignored, as OpenAI clients
 * send many; fields we know but cannot honour (n > 1, stop sequences, echo,
 * logprobs, tools) are refused rather than silently ignored, because the
 * client would otherwise get something else than it asked for.
 *
 * The byte-level tokenizer makes every prompt valid and every output a byte
 * string: generated text need not be UTF-8, so text goes through
 * flare_utf8_clean before it enters JSON.
 *
 * Invariants:
 *   1. flare_api_parse either fills *out completely (prompt non-empty,
 *      1 <= max_tokens, n_prompt + max_tokens <= max_context) or leaves it
 *      empty and fills *err with a status and, where one field is at
 *      fault, its name.
 *   2. Every body produced here is valid JSON in valid UTF-8.
 */
#include "flare/api.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helios/tokenizer.h"

#define INVALID "invalid_request_error"

void flare_api_error_set(struct flare_api_error *e, unsigned status, const char *type,
			 const char *param, const char *code, const char *fmt, ...)
{
	e->status = status;
	e->type = type ? type : INVALID;
	e->code = code;
	snprintf(e->param, sizeof e->param, "%s", param ? param : "");
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->message, sizeof e->message, fmt, ap);
	va_end(ap);
}

#define FAIL(status, param, code, ...)                                                          \
	do {                                                                                    \
		flare_api_error_set(err, status, INVALID, param, code, __VA_ARGS__);           \
		goto fail;                                                                      \
	} while (0)

/* A member that is absent or JSON null reads as absent. */
static json_t *member(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	return v && !json_is_null(v) ? v : NULL;
}

static const char *json_type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT: return "an object";
	case JSON_ARRAY: return "an array";
	case JSON_STRING: return "a string";
	case JSON_INTEGER: return "an integer";
	case JSON_REAL: return "a number";
	case JSON_TRUE: case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "?";
}

struct parts {
	hel_message *msgs;
	char **owned;
	size_t n;
};

static void parts_free(struct parts *p)
{
	for (size_t i = 0; i < p->n; i++)
		free(p->owned[i]);
	free(p->owned);
	free(p->msgs);
	memset(p, 0, sizeof *p);
}

/* messages -> hel_message[]; content as a string, null or text parts. */
static int read_messages(json_t *arr, struct parts *p, struct flare_api_error *err)
{
	size_t n = json_array_size(arr);
	char param[96];
	if (n == 0)
		FAIL(400, "messages", NULL, "messages must not be empty");
	p->msgs = calloc(n, sizeof *p->msgs);
	p->owned = calloc(n, sizeof *p->owned);
	if (!p->msgs || !p->owned)
		FAIL(500, NULL, NULL, "out of memory");
	for (size_t i = 0; i < n; i++, p->n++) {
		json_t *m = json_array_get(arr, i);
		if (!json_is_object(m)) {
			snprintf(param, sizeof param, "messages[%zu]", i);
			FAIL(400, param, NULL, "%s must be an object, not %s", param, json_type_name(m));
		}
		json_t *role = json_object_get(m, "role");
		snprintf(param, sizeof param, "messages[%zu].role", i);
		if (!role)
			FAIL(400, param, NULL, "%s is missing", param);
		if (!json_is_string(role))
			FAIL(400, param, NULL, "%s must be a string, not %s", param, json_type_name(role));
		const char *r = json_string_value(role);
		size_t rl = json_string_length(role);
		if (rl == 0 || rl > 64 || strlen(r) != rl || strpbrk(r, "\n\r:"))
			FAIL(400, param, NULL, "%s must be 1 to 64 characters without ':', newlines or NUL",
			     param);
		p->msgs[i].role = r;

		json_t *content = json_object_get(m, "content");
		snprintf(param, sizeof param, "messages[%zu].content", i);
		if (!content || json_is_null(content)) {
			p->msgs[i].content = "";
			p->msgs[i].content_len = 0;
		} else if (json_is_string(content)) {
			p->msgs[i].content = json_string_value(content);
			p->msgs[i].content_len = json_string_length(content);
		} else if (json_is_array(content)) {
			struct flare_buf b = {0};
			size_t j;
			json_t *part;
			json_array_foreach(content, j, part) {
				char pp[96];
				snprintf(pp, sizeof pp, "messages[%zu].content[%zu]", i, j);
				json_t *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
				json_t *text = json_is_object(part) ? json_object_get(part, "text") : NULL;
				if (!json_is_object(part) || !json_is_string(type) ||
				    strcmp(json_string_value(type), "text") || !json_is_string(text)) {
					flare_buf_free(&b);
					FAIL(400, pp, NULL,
					     "%s must be a text part {\"type\": \"text\", \"text\": \"...\"}", pp);
				}
				flare_buf_append(&b, json_string_value(text), json_string_length(text));
			}
			if (flare_buf_failed(&b)) {
				flare_buf_free(&b);
				FAIL(500, NULL, NULL, "out of memory");
			}
			p->msgs[i].content_len = b.len;
			p->owned[i] = flare_buf_take(&b, NULL);
			if (!p->owned[i])
				FAIL(500, NULL, NULL, "out of memory");
			p->msgs[i].content = p->owned[i];
		} else {
			FAIL(400, param, NULL, "%s must be a string or an array of text parts, not %s",
			     param, json_type_name(content));
		}
	}
	return 0;
fail:
	return -EINVAL;
}

/* An optional non-negative integer field; *present says whether it was
 * there.  Bounds are inclusive. */
static int read_uint(json_t *body, const char *key, int64_t lo, int64_t hi, int64_t *out,
		     bool *present, struct flare_api_error *err)
{
	json_t *v = member(body, key);
	*present = v != NULL;
	if (!v)
		return 0;
	if (!json_is_integer(v))
		FAIL(400, key, NULL, "%s must be an integer, not %s", key, json_type_name(v));
	int64_t x = json_integer_value(v);
	if (x < lo || x > hi)
		FAIL(400, key, NULL, "%s must be from %" PRId64 " to %" PRId64 " (got %" PRId64 ")", key,
		     lo, hi, x);
	*out = x;
	return 0;
fail:
	return -EINVAL;
}

static int read_bool(json_t *body, const char *key, bool *out, struct flare_api_error *err)
{
	json_t *v = member(body, key);
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		FAIL(400, key, NULL, "%s must be a boolean, not %s", key, json_type_name(v));
	*out = json_is_true(v);
	return 0;
fail:
	return -EINVAL;
}

/* Fields we know but do not implement: refused unless they ask for the
 * default behaviour. */
static int refuse_unsupported(json_t *body, enum flare_api_kind kind, struct flare_api_error *err)
{
	json_t *v;
	if ((v = member(body, "n")) && !(json_is_integer(v) && json_integer_value(v) == 1))
		FAIL(400, "n", NULL, "n must be 1: one choice per request");
	if ((v = member(body, "best_of")) && !(json_is_integer(v) && json_integer_value(v) == 1))
		FAIL(400, "best_of", NULL, "best_of must be 1");
	if ((v = member(body, "echo")) && !json_is_false(v))
		FAIL(400, "echo", NULL, "echo is not supported");
	if ((v = member(body, "stop")) &&
	    !(json_is_array(v) && json_array_size(v) == 0) &&
	    !(json_is_string(v) && json_string_length(v) == 0))
		FAIL(400, "stop", NULL, "stop sequences are not supported");
	if ((v = member(body, "logprobs")) && !json_is_false(v) &&
	    !(kind == FLARE_API_COMPLETIONS && json_is_integer(v) && json_integer_value(v) == 0))
		FAIL(400, "logprobs", NULL, "logprobs are not supported");
	if ((v = member(body, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
		FAIL(400, "top_logprobs", NULL, "top_logprobs are not supported");
	if ((v = member(body, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
		FAIL(400, "suffix", NULL, "suffix is not supported");
	if ((v = member(body, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
		FAIL(400, "tools", NULL, "tools are not supported");
	if ((v = member(body, "response_format"))) {
		json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
		if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
			FAIL(400, "response_format", NULL, "response_format must be {\"type\": \"text\"}");
	}
	return 0;
fail:
	return -EINVAL;
}

int flare_api_parse(enum flare_api_kind kind, const char *body, size_t len,
		    const struct flare_api_limits *lim, struct flare_api_request *out,
		    struct flare_api_error *err)
{
	memset(out, 0, sizeof *out);
	memset(err, 0, sizeof *err);
	out->kind = kind;
	struct parts parts = {0};
	json_error_t jerr;
	json_t *root = json_loadb(body, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
	const char *prompt_field = kind == FLARE_API_CHAT ? "messages" : "prompt";
	if (!root)
		FAIL(400, NULL, NULL, "request body is not valid JSON: %s (line %d, column %d)",
		     jerr.text, jerr.line, jerr.column);
	if (!json_is_object(root))
		FAIL(400, NULL, NULL, "request body must be a JSON object, not %s", json_type_name(root));

	json_t *v = member(root, "model");
	if (v && !json_is_string(v))
		FAIL(400, "model", NULL, "model must be a string, not %s", json_type_name(v));
	if (v && lim->model && strcmp(json_string_value(v), lim->model))
		FAIL(404, "model", "model_not_found", "model '%.200s' does not exist; this server serves '%s'",
		     json_string_value(v), lim->model);

	if (refuse_unsupported(root, kind, err))
		goto fail;

	/* The prompt. */
	v = json_object_get(root, prompt_field);
	if (!v || json_is_null(v))
		FAIL(400, prompt_field, NULL, "%s is required", prompt_field);
	if (kind == FLARE_API_COMPLETIONS) {
		if (json_is_string(v)) {
			size_t n = json_string_length(v);
			if (n == 0)
				FAIL(400, "prompt", NULL, "prompt must not be empty");
			if (n >= lim->max_context)
				FAIL(400, "prompt", "context_length_exceeded",
				     "prompt is %zu tokens; the context holds %" PRIu64
				     " including the reply", n, lim->max_context);
			out->prompt = malloc(n * sizeof *out->prompt);
			if (!out->prompt)
				FAIL(500, NULL, NULL, "out of memory");
			out->n_prompt = (uint32_t)hel_tokenize(json_string_value(v), n, out->prompt);
		} else if (json_is_array(v)) {
			size_t n = json_array_size(v), i;
			json_t *t;
			if (n == 0)
				FAIL(400, "prompt", NULL, "prompt must not be empty");
			if (!json_is_integer(json_array_get(v, 0)))
				FAIL(400, "prompt", NULL,
				     "prompt must be a string or an array of token ids (batches are not "
				     "supported)");
			if (n >= lim->max_context)
				FAIL(400, "prompt", "context_length_exceeded",
				     "prompt is %zu tokens; the context holds %" PRIu64
				     " including the reply", n, lim->max_context);
			out->prompt = malloc(n * sizeof *out->prompt);
			if (!out->prompt)
				FAIL(500, NULL, NULL, "out of memory");
			json_array_foreach(v, i, t) {
				char pp[48];
				snprintf(pp, sizeof pp, "prompt[%zu]", i);
				if (!json_is_integer(t) || json_integer_value(t) < 0 ||
				    json_integer_value(t) >= (json_int_t)lim->vocab)
					FAIL(400, pp, NULL, "%s must be a token id from 0 to %u", pp,
					     lim->vocab ? lim->vocab - 1 : 0);
				out->prompt[i] = (hel_token)json_integer_value(t);
			}
			out->n_prompt = (uint32_t)n;
		} else {
			FAIL(400, "prompt", NULL, "prompt must be a string or an array of token ids, not %s",
			     json_type_name(v));
		}
	} else {
		if (!json_is_array(v))
			FAIL(400, "messages", NULL, "messages must be an array, not %s", json_type_name(v));
		if (read_messages(v, &parts, err))
			goto fail;
		size_t n = hel_chat_template(parts.msgs, parts.n, true, NULL, 0);
		if (n >= lim->max_context)
			FAIL(400, "messages", "context_length_exceeded",
			     "messages are %zu tokens; the context holds %" PRIu64 " including the reply",
			     n, lim->max_context);
		out->prompt = malloc(n * sizeof *out->prompt);
		if (!out->prompt)
			FAIL(500, NULL, NULL, "out of memory");
		out->n_prompt = (uint32_t)hel_chat_template(parts.msgs, parts.n, true, out->prompt, n);
	}

	/* max_tokens (chat: max_completion_tokens wins). */
	uint64_t room = lim->max_context - out->n_prompt;
	int64_t mt = 0;
	bool have = false;
	const char *mt_field = "max_tokens";
	if (kind == FLARE_API_CHAT) {
		if (read_uint(root, "max_completion_tokens", 1, INT64_MAX, &mt, &have, err))
			goto fail;
		if (have)
			mt_field = "max_completion_tokens";
	}
	if (!have && read_uint(root, "max_tokens", 1, INT64_MAX, &mt, &have, err))
		goto fail;
	if (have) {
		if ((uint64_t)mt > room)
			FAIL(400, mt_field, "context_length_exceeded",
			     "%s is %" PRId64 " but the prompt (%u tokens) leaves room for %" PRIu64
			     " in a context of %" PRIu64, mt_field, mt, out->n_prompt, room, lim->max_context);
		out->max_tokens = (uint32_t)mt;
	} else {
		uint32_t d = lim->default_max_tokens ? lim->default_max_tokens
						     : FLARE_API_DEFAULT_MAX_TOKENS;
		out->max_tokens = room < d ? (uint32_t)room : d;
	}

	/* Sampling. */
	out->sampler.temperature = 1.0;
	if ((v = member(root, "temperature"))) {
		if (!json_is_number(v))
			FAIL(400, "temperature", NULL, "temperature must be a number, not %s",
			     json_type_name(v));
		double t = json_number_value(v);
		if (!(t >= 0.0 && t <= 2.0))
			FAIL(400, "temperature", NULL, "temperature must be from 0 to 2 (got %g)", t);
		out->sampler.temperature = t;
	}
	if ((v = member(root, "seed"))) {
		if (!json_is_integer(v))
			FAIL(400, "seed", NULL, "seed must be an integer, not %s", json_type_name(v));
		out->sampler.seed = (uint64_t)json_integer_value(v);
		out->seed_set = true;
	}

	/* Streaming. */
	if (read_bool(root, "stream", &out->stream, err))
		goto fail;
	/* ignore_eos (vLLM's extension, for benchmarks): run to max_tokens. */
	if (read_bool(root, "ignore_eos", &out->ignore_eos, err))
		goto fail;
	if ((v = member(root, "stream_options"))) {
		if (!json_is_object(v))
			FAIL(400, "stream_options", NULL, "stream_options must be an object, not %s",
			     json_type_name(v));
		json_t *iu = member(v, "include_usage");
		if (iu && !json_is_boolean(iu))
			FAIL(400, "stream_options.include_usage", NULL,
			     "stream_options.include_usage must be a boolean, not %s", json_type_name(iu));
		out->include_usage = iu && json_is_true(iu);
	}

	/* The cache salt: cache_salt, else user (tenants never share prefixes). */
	json_t *salt = member(root, "cache_salt");
	const char *salt_field = "cache_salt";
	if (salt) {
		if (!json_is_string(salt))
			FAIL(400, "cache_salt", NULL, "cache_salt must be a string, not %s",
			     json_type_name(salt));
		if (json_string_length(salt) == 0)
			FAIL(400, "cache_salt", NULL, "cache_salt must not be empty");
	} else if ((salt = member(root, "user"))) {
		salt_field = "user";
		if (!json_is_string(salt))
			FAIL(400, "user", NULL, "user must be a string, not %s", json_type_name(salt));
		if (json_string_length(salt) == 0)
			salt = NULL;
	}
	if (salt) {
		size_t sl = json_string_length(salt);
		if (sl > FLARE_API_SALT_MAX)
			FAIL(400, salt_field, NULL, "%s must be at most %d bytes", salt_field,
			     FLARE_API_SALT_MAX);
		out->salt = malloc(sl + 1);
		if (!out->salt)
			FAIL(500, NULL, NULL, "out of memory");
		memcpy(out->salt, json_string_value(salt), sl + 1);
		out->salt_len = sl;
	}
	parts_free(&parts);
	json_decref(root);
	return 0;
fail:
	if (err->status == 500)
		err->type = "server_error";
	parts_free(&parts);
	json_decref(root);
	flare_api_request_free(out);
	return -EINVAL;
}

void flare_api_request_free(struct flare_api_request *r)
{
	free(r->prompt);
	free(r->salt);
	enum flare_api_kind k = r->kind;
	memset(r, 0, sizeof *r);
	r->kind = k;
}

/* ---- JSON output ---------------------------------------------------------- */

static void dump(struct flare_buf *out, json_t *j)
{
	if (!j) {
		out->failed = true;
		return;
	}
	char *s = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!s) {
		out->failed = true;
		return;
	}
	flare_buf_puts(out, s);
	free(s);
}

void flare_api_error_json(struct flare_buf *out, const struct flare_api_error *e)
{
	json_t *param = e->param[0] ? json_string(e->param) : json_null();
	json_t *code = e->code ? json_string(e->code) : json_null();
	struct flare_buf msg = {0};
	flare_utf8_clean(e->message, strlen(e->message), true, &msg);
	json_t *j = json_pack("{s:{s:s?, s:s, s:o, s:o}}", "error", "message",
			      msg.data ? msg.data : "", "type", e->type ? e->type : INVALID, "param",
			      param, "code", code);
	flare_buf_free(&msg);
	dump(out, j);
}

static int utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0];
	if (c < 0x80)
		return 1;
	int len;
	unsigned char lo = 0x80, hi = 0xbf;
	if (c >= 0xc2 && c <= 0xdf) {
		len = 2;
	} else if (c >= 0xe0 && c <= 0xef) {
		len = 3;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f;
	} else if (c >= 0xf0 && c <= 0xf4) {
		len = 4;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
	} else {
		return -1;
	}
	for (int i = 1; i < len; i++) {
		if ((size_t)i >= n)
			return 0;
		unsigned char b = s[i];
		if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xbf))
			return -1;
	}
	return len;
}

size_t flare_utf8_clean(const char *in, size_t n, bool final, struct flare_buf *out)
{
	const unsigned char *s = (const unsigned char *)in;
	size_t i = 0, run = 0; /* run: start of the pending valid stretch */
	while (i < n) {
		int l = utf8_seq(s + i, n - i);
		if (l > 0) {
			i += (size_t)l;
			continue;
		}
		flare_buf_append(out, in + run, i - run);
		if (l == 0 && !final)
			return i;
		flare_buf_append(out, "\xef\xbf\xbd", 3);
		run = ++i;
	}
	flare_buf_append(out, in + run, i - run);
	return i;
}

const char *flare_api_source(const hel_outcome *o)
{
	if (o->reused_host_tokens > 0) {
		switch (o->host_tier) {
		case SEL_TIER_DISK: return "disk";
		case SEL_TIER_POOL: return "pool";
		default: return "memory";
		}
	}
	return o->reused_gpu_tokens > 0 ? "gpu" : "none";
}

static const char *finish_reason(const hel_outcome *o)
{
	return o->finish_reason && *o->finish_reason ? o->finish_reason : "stop";
}

static json_t *usage_json(const hel_outcome *o)
{
	return json_pack("{s:I, s:I, s:I, s:{s:I}}", "prompt_tokens", (json_int_t)o->prompt_tokens,
			 "completion_tokens", (json_int_t)o->completion_tokens, "total_tokens",
			 (json_int_t)o->prompt_tokens + (json_int_t)o->completion_tokens,
			 "prompt_tokens_details", "cached_tokens", (json_int_t)o->cached_tokens);
}

static json_t *flare_json(const hel_outcome *o)
{
	return json_pack("{s:I, s:I, s:I, s:s, s:I, s:I}", "reused_tokens",
			 (json_int_t)o->cached_tokens, "reused_gpu_tokens",
			 (json_int_t)o->reused_gpu_tokens, "reused_host_tokens",
			 (json_int_t)o->reused_host_tokens, "source", flare_api_source(o),
			 "prefill_tokens", (json_int_t)o->prefill_tokens, "prefill_launches",
			 (json_int_t)o->prefill_launches);
}

static json_t *envelope(const struct flare_api_meta *m, bool chunk)
{
	const char *object = m->kind == FLARE_API_CHAT ? (chunk ? "chat.completion.chunk"
								: "chat.completion")
						       : "text_completion";
	return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object", object, "created",
			 (json_int_t)m->created, "model", m->model ? m->model : "");
}

void flare_api_response(struct flare_buf *out, const struct flare_api_meta *m, const char *text,
			size_t len, const hel_outcome *o)
{
	json_t *j = envelope(m, false);
	json_t *choice;
	if (m->kind == FLARE_API_CHAT)
		choice = json_pack("{s:i, s:{s:s, s:s%}, s:n, s:s}", "index", 0, "message", "role",
				   "assistant", "content", text, len, "logprobs", "finish_reason",
				   finish_reason(o));
	else
		choice = json_pack("{s:i, s:s%, s:n, s:s}", "index", 0, "text", text, len, "logprobs",
				   "finish_reason", finish_reason(o));
	if (j && choice) {
		json_object_set_new(j, "choices", json_pack("[o]", choice));
		json_object_set_new(j, "usage", usage_json(o));
		json_object_set_new(j, "flare", flare_json(o));
	} else {
		json_decref(choice);
		json_decref(j);
		j = NULL;
	}
	dump(out, j);
}

static void sse(struct flare_buf *out, json_t *j)
{
	flare_buf_puts(out, "data: ");
	dump(out, j);
	flare_buf_puts(out, "\n\n");
}

/* A chunk with one choice; finish is NULL while the stream runs. */
static void chunk(struct flare_buf *out, const struct flare_api_meta *m, json_t *delta_or_text,
		  const char *finish, const hel_outcome *o)
{
	json_t *j = envelope(m, true);
	json_t *choice = json_pack("{s:i, s:o, s:n, s:o}", "index", 0,
				   m->kind == FLARE_API_CHAT ? "delta" : "text", delta_or_text,
				   "logprobs", "finish_reason",
				   finish ? json_string(finish) : json_null());
	if (!j || !choice) {
		json_decref(j);
		json_decref(choice);
		out->failed = true;
		return;
	}
	json_object_set_new(j, "choices", json_pack("[o]", choice));
	if (m->include_usage)
		json_object_set_new(j, "usage", json_null());
	if (o)
		json_object_set_new(j, "flare", flare_json(o));
	sse(out, j);
}

void flare_api_sse_role(struct flare_buf *out, const struct flare_api_meta *m)
{
	chunk(out, m, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL, NULL);
}

void flare_api_sse_text(struct flare_buf *out, const struct flare_api_meta *m, const char *text,
			size_t len)
{
	json_t *t = json_stringn(text, len);
	if (m->kind == FLARE_API_CHAT)
		t = json_pack("{s:o}", "content", t);
	chunk(out, m, t, NULL, NULL);
}

void flare_api_sse_finish(struct flare_buf *out, const struct flare_api_meta *m,
			  const hel_outcome *o)
{
	json_t *t = m->kind == FLARE_API_CHAT ? json_object() : json_string("");
	chunk(out, m, t, finish_reason(o), o);
}

void flare_api_sse_usage(struct flare_buf *out, const struct flare_api_meta *m,
			 const hel_outcome *o)
{
	json_t *j = envelope(m, true);
	if (!j) {
		out->failed = true;
		return;
	}
	json_object_set_new(j, "choices", json_array());
	json_object_set_new(j, "usage", usage_json(o));
	json_object_set_new(j, "flare", flare_json(o));
	sse(out, j);
}

void flare_api_sse_error(struct flare_buf *out, const struct flare_api_error *e)
{
	flare_buf_puts(out, "data: ");
	flare_api_error_json(out, e);
	flare_buf_puts(out, "\n\n");
}

void flare_api_sse_done(struct flare_buf *out)
{
	flare_buf_puts(out, "data: [DONE]\n\n");
}
