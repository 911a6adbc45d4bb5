/*
 * api.c - request validation and response bodies of the OpenAI-compatible
 * API (docs/configuration.md "HTTP API"; design 2.11 metrics, 4 "prefill
 * launches limited to the new tokens" through the "flare" object).
 *
 * DESIGN
 * jansson parses; this file decides what a field may hold and says which
 * field was wrong.  Every field a client may send is in known_fields, as
 * honoured, accepted at its default only, or accepted and ignored (it does
 * not change the result: metadata, store, ...); anything else is refused
 * as OpenAI refuses it, since a field we do not know may change what the
 * client gets.  docs/configuration.md lists the same three classes.
 *
 * A completions prompt may be a batch (strings or token-id lists); each
 * prompt gets n choices, indexed prompt * n + j.  max_tokens defaults to
 * what the context leaves after each prompt, as OpenAI and vLLM do.
 *
 * The byte-level tokenizer makes every prompt valid and every output a byte
 * string: generated text need not be UTF-8, so text goes through
 * flare_utf8_clean before it enters JSON.
 *
 * Invariants:
 *   1. flare_api_parse either fills *out completely (1..FLARE_API_PROMPTS_MAX
 *      prompts, each non-empty with 1 <= max_tokens and n + max_tokens <=
 *      max_context; 1 <= n <= FLARE_API_N_MAX; prompts x n <=
 *      FLARE_API_CHOICES_MAX) or leaves it empty and fills *err with a
 *      status and, where one field is at fault, its name.
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

#include "flare/api_image.h"
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

#define FAIL(status, param, code, ...)                                                             \
	do {                                                                                       \
		flare_api_error_set(err, status, INVALID, param, code, __VA_ARGS__);               \
		goto fail;                                                                         \
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
	case JSON_TRUE:
	case JSON_FALSE: return "a boolean";
	case JSON_NULL: return "null";
	}
	return "?";
}

/* ---- the fields ------------------------------------------------------------ */

/* Every request field we know, by endpoint (docs/configuration.md lists
 * each as honoured, accepted and ignored, or refused).  Anything else is
 * refused as OpenAI refuses it ("Unrecognized request argument"): a field
 * we do not know may change the result. */
#define EP_C 1u /* completions */
#define EP_H 2u /* chat */
static const struct {
	const char *name;
	unsigned ep;
} known_fields[] = {
	/* honoured */
	{"model", EP_C | EP_H},
	{"prompt", EP_C},
	{"messages", EP_H},
	{"max_tokens", EP_C | EP_H},
	{"max_completion_tokens", EP_H},
	{"temperature", EP_C | EP_H},
	{"seed", EP_C | EP_H},
	{"stream", EP_C | EP_H},
	{"stream_options", EP_C | EP_H},
	{"stop", EP_C | EP_H},
	{"n", EP_C | EP_H},
	{"logprobs", EP_C | EP_H},
	{"top_logprobs", EP_H},
	{"cache_salt", EP_C | EP_H},
	{"user", EP_C | EP_H},
	{"ignore_eos", EP_C | EP_H},
	/* accepted at their default, refused otherwise */
	{"best_of", EP_C},
	{"echo", EP_C},
	{"suffix", EP_C},
	{"top_p", EP_C | EP_H},
	{"frequency_penalty", EP_C | EP_H},
	{"presence_penalty", EP_C | EP_H},
	{"logit_bias", EP_C | EP_H},
	{"tools", EP_H},
	{"tool_choice", EP_H},
	{"functions", EP_H},
	{"function_call", EP_H},
	{"response_format", EP_H},
	{"modalities", EP_H},
	{"prediction", EP_H},
	{"audio", EP_H},
	{"web_search_options", EP_H},
	{"reasoning_effort", EP_H},
	{"verbosity", EP_H},
	/* accepted and ignored: they do not change the result */
	{"parallel_tool_calls", EP_H},
	{"metadata", EP_C | EP_H},
	{"store", EP_C | EP_H},
	{"service_tier", EP_C | EP_H},
	{"prompt_cache_key", EP_C | EP_H},
	{"safety_identifier", EP_C | EP_H},
};

static int check_known(json_t *root, enum flare_api_kind kind, struct flare_api_error *err)
{
	unsigned ep = kind == FLARE_API_CHAT ? EP_H : EP_C;
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v)
	{
		size_t i;
		for (i = 0; i < sizeof known_fields / sizeof known_fields[0]; i++)
			if (!strcmp(known_fields[i].name, key))
				break;
		if (i == sizeof known_fields / sizeof known_fields[0] ||
		    !(known_fields[i].ep & ep)) {
			char param[96];
			snprintf(param, sizeof param, "%.80s", key);
			FAIL(400, param, NULL,
			     "unrecognized request argument '%.80s' for %s (docs/"
			     "configuration.md lists the fields)",
			     key,
			     kind == FLARE_API_CHAT ? "/v1/chat/completions" : "/v1/completions");
		}
	}
	return 0;
fail:
	return -EINVAL;
}

/* ---- messages ---------------------------------------------------------------- */

struct parts {
	hel_message *msgs;
	char **owned;
	size_t n;
	struct flare_api_images imgs; /* image_url parts (api_image.h) */
};

static void parts_free(struct parts *p)
{
	flare_api_images_free(&p->imgs);
	for (size_t i = 0; i < p->n; i++)
		free(p->owned[i]);
	free(p->owned);
	free(p->msgs);
	memset(p, 0, sizeof *p);
}

static const char *const roles[] = {"system", "developer", "user", "assistant"};

/* A message member that is absent, null, or an empty string/array. */
static bool empty_value(json_t *v)
{
	return !v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0) ||
	       (json_is_array(v) && json_array_size(v) == 0);
}

/* messages -> hel_message[]; content as a string, null or text and
 * image_url parts. */
static int read_messages(json_t *arr, const struct flare_api_limits *lim, struct parts *p,
			 struct flare_api_error *err)
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
			FAIL(400, param, NULL, "%s must be an object, not %s", param,
			     json_type_name(m));
		}
		json_t *role = json_object_get(m, "role");
		snprintf(param, sizeof param, "messages[%zu].role", i);
		if (!role)
			FAIL(400, param, NULL, "%s is missing", param);
		if (!json_is_string(role))
			FAIL(400, param, NULL, "%s must be a string, not %s", param,
			     json_type_name(role));
		const char *r = json_string_value(role);
		size_t k;
		for (k = 0; k < sizeof roles / sizeof roles[0]; k++)
			if (!strcmp(r, roles[k]) && strlen(r) == json_string_length(role))
				break;
		if (k == sizeof roles / sizeof roles[0]) {
			if (!strcmp(r, "tool") || !strcmp(r, "function"))
				FAIL(400, param, NULL,
				     "%s '%s' is not supported (tools are not implemented)", param,
				     r);
			FAIL(400, param, NULL,
			     "%s '%.64s' is not a role (expected system, developer, user or assistant)",
			     param, r);
		}
		p->msgs[i].role = r;

		/* The other members: content; those that would change the prompt
		 * only when empty; nothing unknown. */
		const char *key;
		json_t *v;
		json_object_foreach(m, key, v)
		{
			if (!strcmp(key, "role") || !strcmp(key, "content"))
				continue;
			snprintf(param, sizeof param, "messages[%zu].%.40s", i, key);
			if (!strcmp(key, "refusal") || !strcmp(key, "tool_calls") ||
			    !strcmp(key, "function_call") || !strcmp(key, "audio") ||
			    !strcmp(key, "name")) {
				if (!empty_value(v))
					FAIL(400, param, NULL, "%s is not supported", param);
				continue;
			}
			FAIL(400, param, NULL, "%s is not a message field (role, content)", param);
		}

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
			json_array_foreach(content, j, part)
			{
				char pp[96];
				snprintf(pp, sizeof pp, "messages[%zu].content[%zu]", i, j);
				json_t *type =
					json_is_object(part) ? json_object_get(part, "type") : NULL;
				json_t *text =
					json_is_object(part) ? json_object_get(part, "text") : NULL;
				if (json_is_string(type) &&
				    !strcmp(json_string_value(type), "image_url")) {
					if (flare_api_image_part(part, pp, i, b.len, lim, &p->imgs,
								 err)) {
						flare_buf_free(&b);
						goto fail;
					}
					continue;
				}
				if (!json_is_object(part) || !json_is_string(type) ||
				    strcmp(json_string_value(type), "text") ||
				    !json_is_string(text)) {
					flare_buf_free(&b);
					FAIL(400, pp, NULL,
					     "%s must be a text part {\"type\": \"text\", \"text\": \"...\"} "
					     "or an image_url part",
					     pp);
				}
				flare_buf_append(&b, json_string_value(text),
						 json_string_length(text));
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
			FAIL(400, param, NULL,
			     "%s must be a string or an array of text parts, not %s", param,
			     json_type_name(content));
		}
	}
	flare_api_images_bind(&p->imgs, p->msgs, p->n);
	return 0;
fail:
	return -EINVAL;
}

/* ---- scalar fields -------------------------------------------------------------- */

/* An optional integer field; *present says whether it was there.  Bounds
 * are inclusive. */
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
		FAIL(400, key, NULL, "%s must be from %" PRId64 " to %" PRId64 " (got %" PRId64 ")",
		     key, lo, hi, x);
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

/* A number field that must be absent, null or equal to want. */
static int default_number(json_t *body, const char *key, double want, const char *why,
			  struct flare_api_error *err)
{
	json_t *v = member(body, key);
	if (!v)
		return 0;
	if (!json_is_number(v))
		FAIL(400, key, NULL, "%s must be a number, not %s", key, json_type_name(v));
	if (json_number_value(v) != want)
		FAIL(400, key, NULL, "%s must be %g: %s", key, want, why);
	return 0;
fail:
	return -EINVAL;
}

/* An ignored field that must at least have its type. */
static int typed(json_t *body, const char *key, json_type type, const char *what,
		 struct flare_api_error *err)
{
	json_t *v = member(body, key);
	if (v && json_typeof(v) != type && !(type == JSON_TRUE && json_is_boolean(v)))
		FAIL(400, key, NULL, "%s must be %s, not %s", key, what, json_type_name(v));
	return 0;
fail:
	return -EINVAL;
}

/* Fields we know but do not implement: refused unless they ask for the
 * default behaviour; ignored ones checked for their type. */
static int refuse_unsupported(json_t *body, struct flare_api_error *err)
{
	json_t *v;
	if ((v = member(body, "echo")) && !json_is_false(v))
		FAIL(400, "echo", NULL, "echo is not supported");
	if ((v = member(body, "suffix")) && !(json_is_string(v) && json_string_length(v) == 0))
		FAIL(400, "suffix", NULL, "suffix is not supported");
	if (default_number(body, "top_p", 1, "nucleus sampling is not implemented", err) ||
	    default_number(body, "frequency_penalty", 0, "penalties are not implemented", err) ||
	    default_number(body, "presence_penalty", 0, "penalties are not implemented", err))
		goto fail;
	if ((v = member(body, "logit_bias")) && !(json_is_object(v) && json_object_size(v) == 0))
		FAIL(400, "logit_bias", NULL, "logit_bias is not supported");
	if ((v = member(body, "tools")) && !(json_is_array(v) && json_array_size(v) == 0))
		FAIL(400, "tools", NULL, "tools are not supported");
	if ((v = member(body, "functions")) && !(json_is_array(v) && json_array_size(v) == 0))
		FAIL(400, "functions", NULL, "functions are not supported");
	if ((v = member(body, "tool_choice")) &&
	    !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
		FAIL(400, "tool_choice", NULL,
		     "tool_choice must be \"none\": there are no tools (tools are not supported)");
	if ((v = member(body, "function_call")) &&
	    !(json_is_string(v) && !strcmp(json_string_value(v), "none")))
		FAIL(400, "function_call", NULL,
		     "function_call must be \"none\": functions are not supported");
	if ((v = member(body, "response_format"))) {
		json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
		if (!json_is_string(t) || strcmp(json_string_value(t), "text"))
			FAIL(400, "response_format", NULL,
			     "response_format must be {\"type\": \"text\"}");
	}
	if ((v = member(body, "modalities")) &&
	    !(json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
	      !strcmp(json_string_value(json_array_get(v, 0)), "text")))
		FAIL(400, "modalities", NULL, "modalities must be [\"text\"]");
	static const char *const none_only[] = {"prediction", "audio", "web_search_options",
						"reasoning_effort", "verbosity"};
	for (size_t i = 0; i < sizeof none_only / sizeof none_only[0]; i++)
		if (member(body, none_only[i]))
			FAIL(400, none_only[i], NULL, "%s is not supported", none_only[i]);
	if (typed(body, "parallel_tool_calls", JSON_TRUE, "a boolean", err) ||
	    typed(body, "metadata", JSON_OBJECT, "an object", err) ||
	    typed(body, "store", JSON_TRUE, "a boolean", err) ||
	    typed(body, "service_tier", JSON_STRING, "a string", err) ||
	    typed(body, "prompt_cache_key", JSON_STRING, "a string", err) ||
	    typed(body, "safety_identifier", JSON_STRING, "a string", err))
		goto fail;
	return 0;
fail:
	return -EINVAL;
}

/* ---- prompts ------------------------------------------------------------------- */

/* One prompt's tokens from a string or an array of token ids; param names
 * it ("prompt", "prompt[2]"). */
static int read_one_prompt(json_t *v, const char *param, const struct flare_api_limits *lim,
			   struct flare_api_prompt *p, struct flare_api_error *err)
{
	size_t n = json_is_string(v) ? json_string_length(v) : json_array_size(v);
	if (n == 0)
		FAIL(400, param, NULL, "%s must not be empty", param);
	if (n >= lim->max_context)
		FAIL(400, param, "context_length_exceeded",
		     "%s is %zu tokens; the context holds %" PRIu64 " including the reply", param,
		     n, lim->max_context);
	p->tokens = malloc(n * sizeof *p->tokens);
	if (!p->tokens)
		FAIL(500, NULL, NULL, "out of memory");
	if (json_is_string(v)) {
		p->n = (uint32_t)hel_tokenize(json_string_value(v), n, p->tokens);
		return 0;
	}
	size_t i;
	json_t *t;
	json_array_foreach(v, i, t)
	{
		char pp[96];
		snprintf(pp, sizeof pp, "%s[%zu]", param, i);
		if (!json_is_integer(t) || json_integer_value(t) < 0 ||
		    json_integer_value(t) >= (json_int_t)lim->vocab)
			FAIL(400, pp, NULL, "%s must be a token id from 0 to %u", pp,
			     lim->vocab ? lim->vocab - 1 : 0);
		p->tokens[i] = (hel_token)json_integer_value(t);
	}
	p->n = (uint32_t)n;
	return 0;
fail:
	return -EINVAL;
}

/* prompt: a string, a list of strings, a list of token ids, or a list of
 * lists of token ids. */
static int read_prompts(json_t *v, const struct flare_api_limits *lim,
			struct flare_api_request *out, struct flare_api_error *err)
{
	size_t np = 1;
	bool batch = false;
	if (json_is_array(v)) {
		size_t n = json_array_size(v);
		if (n == 0)
			FAIL(400, "prompt", NULL, "prompt must not be empty");
		json_t *first = json_array_get(v, 0);
		if (json_is_string(first) || json_is_array(first)) {
			batch = true;
			np = n;
			for (size_t i = 0; i < n; i++) {
				json_t *e = json_array_get(v, i);
				if (json_typeof(e) != json_typeof(first)) {
					char pp[48];
					snprintf(pp, sizeof pp, "prompt[%zu]", i);
					FAIL(400, pp, NULL, "%s must be %s like prompt[0], not %s",
					     pp, json_type_name(first), json_type_name(e));
				}
			}
		} else if (!json_is_integer(first)) {
			FAIL(400, "prompt", NULL,
			     "prompt must be a string, a list of strings, a list of token ids or a "
			     "list of lists of token ids; prompt[0] is %s",
			     json_type_name(first));
		}
	} else if (!json_is_string(v)) {
		FAIL(400, "prompt", NULL,
		     "prompt must be a string, a list of strings, a list of token ids or a list of "
		     "lists of token ids, not %s",
		     json_type_name(v));
	}
	if (np > FLARE_API_PROMPTS_MAX)
		FAIL(400, "prompt", NULL, "prompt holds %zu prompts; at most %d per request", np,
		     FLARE_API_PROMPTS_MAX);
	out->prompts = calloc(np, sizeof *out->prompts);
	if (!out->prompts)
		FAIL(500, NULL, NULL, "out of memory");
	for (size_t i = 0; i < np; i++) {
		out->n_prompts = (uint32_t)i + 1; /* freed with the request, even half-read */
		char pp[48];
		snprintf(pp, sizeof pp, batch ? "prompt[%zu]" : "prompt", i);
		if (read_one_prompt(batch ? json_array_get(v, i) : v, pp, lim, &out->prompts[i],
				    err))
			goto fail;
	}
	return 0;
fail:
	return -EINVAL;
}

/* stop: a string or an array of at most FLARE_STOP_MAX strings. */
static int read_stop(json_t *body, struct flare_stop *st, struct flare_api_error *err)
{
	json_t *v = member(body, "stop");
	if (!v)
		return 0;
	if (json_is_string(v)) {
		size_t l = json_string_length(v);
		if (l > FLARE_STOP_BYTES)
			FAIL(400, "stop", NULL, "stop must be at most %d bytes", FLARE_STOP_BYTES);
		if (l)
			flare_stop_add(st, json_string_value(v), l);
		return 0;
	}
	if (!json_is_array(v))
		FAIL(400, "stop", NULL, "stop must be a string or an array of strings, not %s",
		     json_type_name(v));
	if (json_array_size(v) > FLARE_STOP_MAX)
		FAIL(400, "stop", NULL, "stop holds %zu sequences; at most %d", json_array_size(v),
		     FLARE_STOP_MAX);
	size_t i;
	json_t *s;
	json_array_foreach(v, i, s)
	{
		char pp[32];
		snprintf(pp, sizeof pp, "stop[%zu]", i);
		if (!json_is_string(s))
			FAIL(400, pp, NULL, "%s must be a string, not %s", pp, json_type_name(s));
		if (json_string_length(s) == 0 || json_string_length(s) > FLARE_STOP_BYTES)
			FAIL(400, pp, NULL, "%s must be 1 to %d bytes", pp, FLARE_STOP_BYTES);
		flare_stop_add(st, json_string_value(s), json_string_length(s));
	}
	return 0;
fail:
	return -EINVAL;
}

/* logprobs (chat: a boolean, with top_logprobs 0..20; completions: an
 * integer 0..20, the alternatives per token). */
static int read_logprobs(json_t *body, enum flare_api_kind kind, struct flare_api_request *out,
			 struct flare_api_error *err)
{
	json_t *v = member(body, "logprobs");
	int64_t k = 0;
	bool have = false;
	if (kind == FLARE_API_CHAT) {
		if (read_bool(body, "logprobs", &out->logprobs, err) ||
		    read_uint(body, "top_logprobs", 0, FLARE_API_TOP_LOGPROBS_MAX, &k, &have, err))
			goto fail;
		if (have && !out->logprobs)
			FAIL(400, "top_logprobs", NULL, "top_logprobs needs \"logprobs\": true");
		out->top_logprobs = (uint32_t)k;
		return 0;
	}
	if (v && json_is_false(v))
		return 0;
	if (read_uint(body, "logprobs", 0, FLARE_API_TOP_LOGPROBS_MAX, &k, &have, err))
		goto fail;
	out->logprobs = have;
	out->top_logprobs = (uint32_t)k;
	return 0;
fail:
	return -EINVAL;
}

/* model (when the server names one) and n, with best_of (completions)
 * that may only repeat it. */
static int read_model_n(json_t *root, const struct flare_api_limits *lim,
			struct flare_api_request *out, struct flare_api_error *err)
{
	json_t *v = member(root, "model");
	if (v && !json_is_string(v))
		FAIL(400, "model", NULL, "model must be a string, not %s", json_type_name(v));
	if (v && lim->model && strcmp(json_string_value(v), lim->model))
		FAIL(404, "model", "model_not_found",
		     "model '%.200s' does not exist; this server serves '%s'", json_string_value(v),
		     lim->model);
	if (refuse_unsupported(root, err))
		goto fail;
	int64_t x = 1;
	bool have = false;
	if (read_uint(root, "n", 1, FLARE_API_N_MAX, &x, &have, err))
		goto fail;
	out->n = (uint32_t)x;
	if ((v = member(root, "best_of")) &&
	    !(json_is_integer(v) && json_integer_value(v) == (json_int_t)out->n))
		FAIL(400, "best_of", NULL,
		     "best_of must equal n (%u): choosing the best of more "
		     "choices is not implemented",
		     out->n);
	return 0;
fail:
	return -EINVAL;
}

/* The prompts: completions' prompt, or the chat's messages through the
 * template; n choices each, within the request's bound. */
static int read_prompt_field(json_t *root, enum flare_api_kind kind,
			     const struct flare_api_limits *lim, struct parts *parts,
			     struct flare_api_request *out, struct flare_api_error *err)
{
	const char *prompt_field = kind == FLARE_API_CHAT ? "messages" : "prompt";
	json_t *v = json_object_get(root, prompt_field);
	if (!v || json_is_null(v))
		FAIL(400, prompt_field, NULL, "%s is required", prompt_field);
	if (kind == FLARE_API_COMPLETIONS) {
		if (read_prompts(v, lim, out, err))
			goto fail;
	} else {
		if (!json_is_array(v))
			FAIL(400, "messages", NULL, "messages must be an array, not %s",
			     json_type_name(v));
		if (read_messages(v, lim, parts, err))
			goto fail;
		size_t n = hel_chat_template(parts->msgs, parts->n, true, NULL, 0);
		if (n >= lim->max_context)
			FAIL(400, "messages", "context_length_exceeded",
			     "messages are %zu tokens; the context holds %" PRIu64
			     " including the reply",
			     n, lim->max_context);
		if (!(out->prompts = calloc(1, sizeof *out->prompts)) ||
		    !(out->prompts[0].tokens = malloc(n * sizeof *out->prompts[0].tokens)))
			FAIL(500, NULL, NULL, "out of memory");
		out->n_prompts = 1;
		out->prompts[0].n = (uint32_t)hel_chat_template(parts->msgs, parts->n, true,
								out->prompts[0].tokens, n);
		if (flare_api_images_place(&parts->imgs, out->prompts[0].tokens, n))
			FAIL(500, NULL, NULL, "the chat template lost an image");
		flare_api_images_move(&parts->imgs, out);
	}
	if ((uint64_t)out->n_prompts * out->n > FLARE_API_CHOICES_MAX)
		FAIL(400, "n", NULL, "%u prompts with n %u make %u choices; at most %d per request",
		     out->n_prompts, out->n, out->n_prompts * out->n, FLARE_API_CHOICES_MAX);
	return 0;
fail:
	return -EINVAL;
}

/* max_tokens (chat: max_completion_tokens wins); by default what the
 * context leaves each prompt. */
static int read_max_tokens(json_t *root, enum flare_api_kind kind,
			   const struct flare_api_limits *lim, struct flare_api_request *out,
			   struct flare_api_error *err)
{
	int64_t mt = 0;
	const char *mt_field = "max_tokens";
	bool have = false;
	if (kind == FLARE_API_CHAT) {
		if (read_uint(root, "max_completion_tokens", 1, INT64_MAX, &mt, &have, err))
			goto fail;
		if (have)
			mt_field = "max_completion_tokens";
	}
	if (!have && read_uint(root, "max_tokens", 1, INT64_MAX, &mt, &have, err))
		goto fail;
	for (uint32_t i = 0; i < out->n_prompts; i++) {
		struct flare_api_prompt *p = &out->prompts[i];
		uint64_t room = lim->max_context - p->n;
		if (have && (uint64_t)mt > room)
			FAIL(400, mt_field, "context_length_exceeded",
			     "%s is %" PRId64
			     " but the prompt%s (%u tokens) leaves room for %" PRIu64
			     " in a context of %" PRIu64,
			     mt_field, mt, out->n_prompts > 1 ? "s' longest" : "", p->n, room,
			     lim->max_context);
		p->max_tokens =
			have ? (uint32_t)mt : (uint32_t)(room < UINT32_MAX ? room : UINT32_MAX);
	}
	return 0;
fail:
	return -EINVAL;
}

/* Sampling: temperature, seed, stop sequences, logprobs. */
static int read_sampling(json_t *root, enum flare_api_kind kind, struct flare_api_request *out,
			 struct flare_api_error *err)
{
	json_t *v;
	out->sampler.temperature = 1.0;
	if ((v = member(root, "temperature"))) {
		if (!json_is_number(v))
			FAIL(400, "temperature", NULL, "temperature must be a number, not %s",
			     json_type_name(v));
		double t = json_number_value(v);
		if (!(t >= 0.0 && t <= 2.0))
			FAIL(400, "temperature", NULL, "temperature must be from 0 to 2 (got %g)",
			     t);
		out->sampler.temperature = t;
	}
	if ((v = member(root, "seed"))) {
		if (!json_is_integer(v))
			FAIL(400, "seed", NULL, "seed must be an integer, not %s",
			     json_type_name(v));
		out->sampler.seed = (uint64_t)json_integer_value(v);
		out->seed_set = true;
	}
	if (read_stop(root, &out->stop, err) || read_logprobs(root, kind, out, err))
		goto fail;
	return 0;
fail:
	return -EINVAL;
}

/* Streaming: stream, ignore_eos (vLLM's extension, for benchmarks: run to
 * max_tokens), stream_options. */
static int read_streaming(json_t *root, struct flare_api_request *out, struct flare_api_error *err)
{
	json_t *v;
	if (read_bool(root, "stream", &out->stream, err) ||
	    read_bool(root, "ignore_eos", &out->ignore_eos, err))
		goto fail;
	if ((v = member(root, "stream_options"))) {
		if (!out->stream)
			FAIL(400, "stream_options", NULL, "stream_options needs \"stream\": true");
		if (!json_is_object(v))
			FAIL(400, "stream_options", NULL,
			     "stream_options must be an object, not %s", json_type_name(v));
		const char *key;
		json_t *o;
		json_object_foreach(v, key, o)
		{
			char pp[96];
			snprintf(pp, sizeof pp, "stream_options.%.60s", key);
			if (strcmp(key, "include_usage") && strcmp(key, "include_obfuscation"))
				FAIL(400, pp, NULL, "unrecognized stream option '%.60s'", key);
			if (!json_is_null(o) && !json_is_boolean(o))
				FAIL(400, pp, NULL, "%s must be a boolean, not %s", pp,
				     json_type_name(o));
		}
		json_t *iu = member(v, "include_usage");
		out->include_usage = iu && json_is_true(iu);
	}
	return 0;
fail:
	return -EINVAL;
}

/* The cache salt: cache_salt, else user (tenants never share prefixes). */
static int read_salt(json_t *root, struct flare_api_request *out, struct flare_api_error *err)
{
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
			FAIL(400, "user", NULL, "user must be a string, not %s",
			     json_type_name(salt));
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
	out->n = 1;
	struct parts parts = {0};
	json_error_t jerr;
	json_t *root = json_loadb(body, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		FAIL(400, NULL, NULL, "request body is not valid JSON: %s (line %d, column %d)",
		     jerr.text, jerr.line, jerr.column);
	if (!json_is_object(root))
		FAIL(400, NULL, NULL, "request body must be a JSON object, not %s",
		     json_type_name(root));
	if (check_known(root, kind, err) || read_model_n(root, lim, out, err) ||
	    read_prompt_field(root, kind, lim, &parts, out, err) ||
	    read_max_tokens(root, kind, lim, out, err) || read_sampling(root, kind, out, err) ||
	    read_streaming(root, out, err) || read_salt(root, out, err))
		goto fail;
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
	for (uint32_t i = 0; r->prompts && i < r->n_prompts; i++)
		free(r->prompts[i].tokens);
	free(r->prompts);
	free(r->salt);
	flare_api_request_images_free(r->images, r->n_images);
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
	json_t *j =
		json_pack("{s:{s:s?, s:s, s:o, s:o}}", "error", "message", msg.data ? msg.data : "",
			  "type", e->type ? e->type : INVALID, "param", param, "code", code);
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
		case SEL_TIER_POOL:
			if (!o->host_neighbour)
				return "pool";
			/* a neighbour's GPU cache keeps the first name */
			return o->host_neighbour_tier == SEL_TIER_MEMORY ? "neighbour_memory"
			       : o->host_neighbour_tier == SEL_TIER_DISK ? "neighbour_disk"
									 : "neighbour";
		case SEL_TIER_REMOTE: return "remote";
		default: return "memory";
		}
	}
	return o->reused_gpu_tokens > 0 ? "gpu" : "none";
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
	return json_pack(
		"{s:I, s:I, s:I, s:s, s:I, s:I, s:{s:I, s:I, s:I}, s:I}", "reused_tokens",
		(json_int_t)o->cached_tokens, "reused_gpu_tokens", (json_int_t)o->reused_gpu_tokens,
		"reused_host_tokens", (json_int_t)o->reused_host_tokens, "source",
		flare_api_source(o), "prefill_tokens", (json_int_t)o->prefill_tokens,
		"prefill_launches", (json_int_t)o->prefill_launches, "speculation", "rounds",
		(json_int_t)o->spec_rounds, "proposed", (json_int_t)o->spec_proposed, "accepted",
		(json_int_t)o->spec_accepted, "overlap_tokens", (json_int_t)o->overlap_tokens);
}

static json_t *envelope(const struct flare_api_meta *m, bool chunk)
{
	const char *object = m->kind == FLARE_API_CHAT
				     ? (chunk ? "chat.completion.chunk" : "chat.completion")
				     : "text_completion";
	return json_pack("{s:s, s:s, s:I, s:s}", "id", m->id, "object", object, "created",
			 (json_int_t)m->created, "model", m->model ? m->model : "");
}

/* ---- logprobs ---------------------------------------------------------------- */

/* A token as logprobs name it: its text when its bytes are valid UTF-8,
 * else "bytes:\xNN" (OpenAI's spelling for part of a character); specials
 * by name.  *nb receives its bytes. */
static void token_name(hel_token t, char *name, size_t cap, unsigned char *bytes, size_t *nb)
{
	*nb = 0;
	if (t < 256) {
		bytes[(*nb)++] = (unsigned char)t;
		if (t < 0x80)
			snprintf(name, cap, "%c", (char)t);
		else
			snprintf(name, cap, "bytes:\\x%02x", t);
		return;
	}
	switch (t) {
	case HEL_TOK_BEGIN: snprintf(name, cap, "<|begin|>"); break;
	case HEL_TOK_END: snprintf(name, cap, "<|end|>"); break;
	case HEL_TOK_MESSAGE: snprintf(name, cap, "<|message|>"); break;
	default: snprintf(name, cap, "<|reserved_%u|>", t); break;
	}
}

/* finite for JSON: -inf (a masked token) as a very small number */
static double lp_value(float v) { return isfinite(v) ? (double)v : -9999.0; }

/* Chat: {"token", "logprob", "bytes"} (and "top_logprobs" when top). */
static json_t *chat_entry(hel_token t, float lp, const hel_logprob *top)
{
	char name[32];
	unsigned char bytes[4];
	size_t nb;
	token_name(t, name, sizeof name, bytes, &nb);
	json_t *b = json_array();
	for (size_t i = 0; i < nb; i++)
		json_array_append_new(b, json_integer(bytes[i]));
	json_t *e =
		json_pack("{s:s, s:f, s:o}", "token", name, "logprob", lp_value(lp), "bytes", b);
	if (e && top) {
		json_t *alts = json_array();
		for (uint32_t i = 0; i < top->n_top; i++)
			json_array_append_new(alts,
					      chat_entry(top->top[i], top->top_logprob[i], NULL));
		json_object_set_new(e, "top_logprobs", alts);
	}
	return e;
}

/* The logprobs object of a choice (chat: {"content": [...], "refusal":
 * null}; completions: tokens, token_logprobs, top_logprobs, text_offset),
 * or null when the request did not ask. */
static json_t *logprobs_json(const struct flare_api_meta *m, const struct flare_api_choice *c)
{
	if (!m->logprobs)
		return json_null();
	if (m->kind == FLARE_API_CHAT) {
		json_t *content = json_array();
		for (size_t i = 0; i < c->n_tokens; i++)
			json_array_append_new(content, chat_entry(c->tokens[i].token,
								  c->tokens[i].lp.logprob,
								  &c->tokens[i].lp));
		return json_pack("{s:o, s:n}", "content", content, "refusal");
	}
	json_t *toks = json_array(), *lps = json_array(), *tops = json_array(),
	       *offs = json_array();
	for (size_t i = 0; i < c->n_tokens; i++) {
		const struct flare_api_token *t = &c->tokens[i];
		char name[32];
		unsigned char bytes[4];
		size_t nb;
		token_name(t->token, name, sizeof name, bytes, &nb);
		json_array_append_new(toks, json_string(name));
		json_array_append_new(lps, json_real(lp_value(t->lp.logprob)));
		/* The alternatives, and the sampled token always (OpenAI). */
		json_t *alt = json_object();
		for (uint32_t k = 0; k < t->lp.n_top; k++) {
			char an[32];
			token_name(t->lp.top[k], an, sizeof an, bytes, &nb);
			json_object_set_new(alt, an, json_real(lp_value(t->lp.top_logprob[k])));
		}
		json_object_set_new(alt, name, json_real(lp_value(t->lp.logprob)));
		json_array_append_new(tops, alt);
		json_array_append_new(offs, json_integer((json_int_t)t->offset));
	}
	return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps,
			 "top_logprobs", tops, "text_offset", offs);
}

/* ---- responses ---------------------------------------------------------------------- */

static json_t *choice_json(const struct flare_api_meta *m, const struct flare_api_choice *c)
{
	json_t *finish = c->finish ? json_string(c->finish) : json_null();
	if (m->kind == FLARE_API_CHAT)
		return json_pack("{s:i, s:{s:s, s:s%}, s:o, s:o}", "index", (int)c->index,
				 "message", "role", "assistant", "content", c->text, c->len,
				 "logprobs", logprobs_json(m, c), "finish_reason", finish);
	return json_pack("{s:i, s:s%, s:o, s:o}", "index", (int)c->index, "text", c->text, c->len,
			 "logprobs", logprobs_json(m, c), "finish_reason", finish);
}

void flare_api_response(struct flare_buf *out, const struct flare_api_meta *m,
			const struct flare_api_choice *c, size_t n, const hel_outcome *total)
{
	json_t *j = envelope(m, false), *choices = json_array();
	for (size_t i = 0; i < n && choices; i++)
		if (json_array_append_new(choices, choice_json(m, &c[i])))
			break;
	if (j && choices && json_array_size(choices) == n) {
		json_object_set_new(j, "choices", choices);
		json_object_set_new(j, "usage", usage_json(total));
		json_object_set_new(j, "flare", flare_json(total));
	} else {
		json_decref(choices);
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
static void chunk(struct flare_buf *out, const struct flare_api_meta *m, uint32_t index,
		  json_t *delta_or_text, json_t *logprobs, const char *finish, const hel_outcome *o)
{
	json_t *j = envelope(m, true);
	json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", (int)index,
				   m->kind == FLARE_API_CHAT ? "delta" : "text", delta_or_text,
				   "logprobs", logprobs ? logprobs : json_null(), "finish_reason",
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

void flare_api_sse_role(struct flare_buf *out, const struct flare_api_meta *m, uint32_t index)
{
	chunk(out, m, index, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), NULL,
	      NULL, NULL);
}

void flare_api_sse_text(struct flare_buf *out, const struct flare_api_meta *m,
			const struct flare_api_choice *c)
{
	json_t *t = json_stringn(c->text, c->len);
	if (m->kind == FLARE_API_CHAT)
		t = json_pack("{s:o}", "content", t);
	chunk(out, m, c->index, t, logprobs_json(m, c), NULL, NULL);
}

void flare_api_sse_finish(struct flare_buf *out, const struct flare_api_meta *m,
			  const struct flare_api_choice *c)
{
	json_t *t = m->kind == FLARE_API_CHAT ? json_object() : json_string("");
	chunk(out, m, c->index, t, NULL, c->finish ? c->finish : "stop", c->o);
}

void flare_api_sse_usage(struct flare_buf *out, const struct flare_api_meta *m,
			 const hel_outcome *total)
{
	json_t *j = envelope(m, true);
	if (!j) {
		out->failed = true;
		return;
	}
	json_object_set_new(j, "choices", json_array());
	json_object_set_new(j, "usage", usage_json(total));
	json_object_set_new(j, "flare", flare_json(total));
	sse(out, j);
}

void flare_api_sse_error(struct flare_buf *out, const struct flare_api_error *e)
{
	flare_buf_puts(out, "data: ");
	flare_api_error_json(out, e);
	flare_buf_puts(out, "\n\n");
}

void flare_api_sse_done(struct flare_buf *out) { flare_buf_puts(out, "data: [DONE]\n\n"); }

void flare_api_model(struct flare_buf *out, const char *model, uint64_t created, bool list)
{
	json_t *one = json_pack("{s:s, s:s, s:I, s:s}", "id", model ? model : "", "object", "model",
				"created", (json_int_t)created, "owned_by", "flare");
	dump(out, list ? json_pack("{s:s, s:[o]}", "object", "list", "data", one) : one);
}
