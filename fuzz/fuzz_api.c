/*
 * fuzz_api.c - libFuzzer target for request validation of the HTTP API
 * (src/flare/api.c; STYLE.md 13).  Its corpus, fuzz/corpus/api/, replays in
 * make check through build/fuzz/replay_api.
 *
 * The first byte picks the endpoint (bit 0: completions or chat) and the
 * core (bit 1: a vision core, whose chats take image parts); the rest is
 * the body.  Besides "never crashes, never leaks", it checks:
 *   1. Success yields prompts within their bounds, each non-empty with
 *      1 <= max_tokens and prompt + max_tokens within the context
 *      (invariant 1 of api.c), and a response built from it, logprobs
 *      included, is valid JSON.
 *   2. Failure yields a 4xx/5xx status, a message, and an error body that
 *      is valid JSON naming the same param.
 *   4. Accepted images lie in order inside the prompt, each a run of
 *      HEL_TOK_IMAGE of its token count (1..max_tokens), the placeholder
 *      nowhere else; none on the text core.
 *   3. flare_utf8_clean turns any bytes into text jansson accepts, and
 *      without `final` consumes all but at most 3 trailing bytes.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flare/api.h"

static void fail(const char *what, const char *detail)
{
	fprintf(stderr, "fuzz_api: %s (%s)\n", what, detail);
	abort();
}

/* Invariant 4. */
static void check_images(const struct flare_api_request *req, const hel_core *core)
{
	if (req->n_images && (!core || req->kind != FLARE_API_CHAT))
		fail("images accepted without a vision core", "");
	const struct flare_api_prompt *p = &req->prompts[0];
	uint32_t k = 0;
	uint64_t end = 0;
	for (uint32_t i = 0; i < req->n_images; i++) {
		const hel_image_input *im = &req->images[i];
		if (im->at < end || im->tokens == 0 || im->tokens > core->image.max_tokens ||
		    (uint64_t)im->at + im->tokens > p->n || !im->bytes || !im->len)
			fail("an image breaks its bounds", "");
		end = (uint64_t)im->at + im->tokens;
	}
	for (uint32_t i = 0; req->kind == FLARE_API_CHAT && i < p->n; i++) {
		while (k < req->n_images && i >= req->images[k].at + req->images[k].tokens)
			k++;
		bool inside = k < req->n_images && i >= req->images[k].at;
		if (inside != (p->tokens[i] == HEL_TOK_IMAGE))
			fail("image placeholders off the images' spans", "");
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	enum flare_api_kind kind = data[0] & 1 ? FLARE_API_CHAT : FLARE_API_COMPLETIONS;
	const char *body = (const char *)data + 1;
	size_t len = size - 1;
	/* What api_image.c reads of a vision core: its name and geometry. */
	static hel_core vision = {.name = "vision-small",
				  .has_image = true,
				  .image = {.patch = 8,
					    .merge = 1,
					    .max_tokens = 16,
					    .resize = HEL_RESIZE_FIT,
					    .channels = 3}};
	struct flare_api_limits lim = {.model = "tiny",
				       .vocab = 320,
				       .max_context = 512,
				       .core = data[0] & 2 ? &vision : NULL};
	struct flare_api_request req;
	struct flare_api_error err;
	struct flare_buf b = {0};
	if (flare_api_parse(kind, body, len, &lim, &req, &err) == 0) {
		if (req.n_prompts == 0 || req.n_prompts > FLARE_API_PROMPTS_MAX || req.n == 0 ||
		    req.n > FLARE_API_N_MAX || req.n_prompts * req.n > FLARE_API_CHOICES_MAX ||
		    req.top_logprobs > FLARE_API_TOP_LOGPROBS_MAX || req.stop.n > FLARE_STOP_MAX)
			fail("accepted request breaks its bounds", "");
		for (uint32_t i = 0; i < req.n_prompts; i++) {
			const struct flare_api_prompt *p = &req.prompts[i];
			if (p->n == 0 || p->max_tokens == 0 ||
			    (uint64_t)p->n + p->max_tokens > lim.max_context)
				fail("accepted request breaks its limits", "");
		}
		if (req.salt && req.salt_len > FLARE_API_SALT_MAX)
			fail("salt too long", "");
		check_images(&req, lim.core);
		struct flare_api_meta m = {.kind = kind,
					   .id = "x-1",
					   .created = 1,
					   .model = "tiny",
					   .include_usage = req.include_usage,
					   .logprobs = req.logprobs};
		hel_outcome o = {.finish_reason = "stop", .prompt_tokens = req.prompts[0].n};
		/* Every token id as a logprobs entry, alternatives included. */
		struct flare_api_token tk[2] = {{.token = req.prompts[0].tokens[0], .offset = 0},
						{.token = 257, .offset = 1}};
		tk[0].lp.n_top = req.top_logprobs;
		for (uint32_t k = 0; k < req.top_logprobs; k++)
			tk[0].lp.top[k] = (hel_token)(k * 37 % 320);
		struct flare_api_choice c = {.index = 0,
					     .text = "ok",
					     .len = 2,
					     .finish = "stop",
					     .tokens = tk,
					     .n_tokens = 2};
		flare_api_response(&b, &m, &c, 1, &o);
		json_t *j = json_loads(b.data, 0, NULL);
		if (!j)
			fail("response is not JSON", b.data);
		json_decref(j);
		flare_api_request_free(&req);
	} else {
		if (err.status < 400 || err.status > 599 || !err.message[0])
			fail("error without status or message", err.message);
		if (req.prompts || req.salt)
			fail("failed parse left allocations", err.message);
		flare_api_error_json(&b, &err);
		json_error_t je;
		json_t *j = json_loads(b.data, 0, &je);
		if (!j)
			fail("error body is not JSON", b.data);
		json_t *p = json_object_get(json_object_get(j, "error"), "param");
		if (err.param[0] ? !json_is_string(p) || strcmp(json_string_value(p), err.param)
				 : !json_is_null(p))
			fail("error body names another param", b.data);
		json_decref(j);
	}
	flare_buf_free(&b);

	/* UTF-8 cleaning of arbitrary bytes. */
	for (int final = 0; final < 2; final++) {
		struct flare_buf t = {0};
		size_t used = flare_utf8_clean((const char *)data, size, final, &t);
		if (final ? used != size : used + 3 < size)
			fail("utf8_clean consumed the wrong amount", "");
		json_t *s = json_stringn(t.data ? t.data : "", t.len);
		if (!s)
			fail("utf8_clean output is not valid UTF-8", "");
		json_decref(s);
		flare_buf_free(&t);
	}
	return 0;
}
