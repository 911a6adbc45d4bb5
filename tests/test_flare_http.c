/*
 * test_flare_http.c - the HTTP API of `flare run` against a fake engine
 * over a real loopback socket (src/flare/server.c, api.c, metrics.c;
 * docs/configuration.md "HTTP API").
 *
 * Covers: /health while starting, ready and stopping; completions and
 * chat completions, plain and streamed (SSE framing, [DONE], the usage
 * chunk, the "flare" object); what reaches the engine (prompt tokens, chat
 * template, sampler, seed, cache salt); issue 14's items: max_tokens by
 * default the rest of the context (1), stop sequences (2), list prompts
 * and n (3), GET /v1/models/{id} (7), shutdown-cut generations ending
 * "abort" (9), validation naming the field (10), and logprobs in both
 * shapes; every bad request naming its field;
 * 404, 405, 413, 503 (queue full, stopping); /metrics as Prometheus text;
 * clients that disconnect mid-stream or while waiting (their engine
 * requests are cancelled); shutdown with requests in flight; concurrent
 * streams.
 */
#include <jansson.h>

#include "flare/server.h"
#include "flare_testlib.h"
#include "helios/tokenizer.h"

#define CONTEXT 256

static struct fake fk;
static struct flare_backend be;
static struct flare_server *srv;
static uint16_t port;

static void start_server(size_t max_body)
{
	fake_init(&fk);
	be = fake_backend(&fk);
	struct flare_server_config cfg = {
		.host = "127.0.0.1",
		.port = 0,
		.limits = {.model = "tiny", .vocab = 320, .max_context = CONTEXT},
		.info = {.model = "tiny",
			 .mode = "off",
			 .store = "memory",
			 .transport = "host",
			 .slot_bytes = 8704},
		.max_body = max_body,
		.watch_ms = 20,
	};
	char err[512];
	int rc = flare_server_start(&cfg, &be, &srv, err, sizeof err);
	CHECKF(rc == 0, "%s", err);
	port = flare_server_port(srv);
	CHECK(port != 0);
	char want[64];
	snprintf(want, sizeof want, "http://127.0.0.1:%u", port);
	CHECK(!strcmp(flare_server_url(srv), want));
}

static json_t *parse_json(const char *text)
{
	json_error_t e;
	json_t *j = json_loads(text, 0, &e);
	CHECKF(j, "not JSON (%s): %s", e.text, text);
	return j;
}

static const char *jstr(json_t *j, const char *path)
{
	/* path: "a.b.c" with numeric parts indexing arrays */
	char buf[128];
	snprintf(buf, sizeof buf, "%s", path);
	json_t *cur = j;
	for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
		cur = (*tok >= '0' && *tok <= '9') ? json_array_get(cur, (size_t)atoi(tok))
						   : json_object_get(cur, tok);
	CHECKF(cur && json_is_string(cur), "%s is not a string", path);
	return json_string_value(cur);
}

static json_t *jget(json_t *j, const char *path)
{
	char buf[128];
	snprintf(buf, sizeof buf, "%s", path);
	json_t *cur = j;
	for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
		cur = (*tok >= '0' && *tok <= '9') ? json_array_get(cur, (size_t)atoi(tok))
						   : json_object_get(cur, tok);
	return cur;
}

static long long jint(json_t *j, const char *path)
{
	json_t *v = jget(j, path);
	CHECKF(v && json_is_integer(v), "%s is not an integer", path);
	return json_integer_value(v);
}

static json_t *post(const char *path, const char *body, int want_status)
{
	struct http_resp r;
	http_request(port, "POST", path, body, &r);
	CHECKF(r.status == want_status, "POST %s %s: status %d, want %d: %s", path, body, r.status,
	       want_status, r.body);
	json_t *j = parse_json(r.body);
	http_resp_free(&r);
	return j;
}

/* A bad request: status and error.param (NULL: null). */
static void bad(const char *path, const char *body, int status, const char *param)
{
	json_t *j = post(path, body, status);
	json_t *e = json_object_get(j, "error");
	CHECKF(json_is_object(e), "no error object for %s", body);
	CHECK(json_is_string(json_object_get(e, "message")));
	CHECK(strlen(jstr(j, "error.message")) > 0);
	CHECK(json_is_string(json_object_get(e, "type")));
	json_t *p = json_object_get(e, "param");
	if (param)
		CHECKF(json_is_string(p) && !strcmp(json_string_value(p), param),
		       "%s: param %s, want %s (%s)", body,
		       json_is_string(p) ? json_string_value(p) : "null", param,
		       jstr(j, "error.message"));
	else
		CHECKF(json_is_null(p), "%s: param should be null", body);
	json_decref(j);
}

/* Split an SSE body into its data payloads; checks the framing. */
static size_t sse_events(const char *body, char ev[][4096], size_t cap)
{
	size_t n = 0;
	const char *p = body;
	while (*p) {
		CHECKF(!strncmp(p, "data: ", 6), "event does not start with 'data: ': %.80s", p);
		const char *end = strstr(p, "\n\n");
		CHECKF(end, "event not ended by a blank line: %.80s", p);
		CHECK(n < cap);
		size_t l = (size_t)(end - p - 6);
		CHECK(l < 4096);
		memcpy(ev[n], p + 6, l);
		ev[n][l] = '\0';
		CHECKF(!strchr(ev[n], '\n'), "multi-line event");
		n++;
		p = end + 2;
	}
	return n;
}

/* ---- tests --------------------------------------------------------------------- */

static void test_health_and_models(void)
{
	struct http_resp r;
	http_request(port, "GET", "/health", NULL, &r);
	CHECK(r.status == 503);
	CHECK(strstr(r.body, "\"starting\""));
	http_resp_free(&r);
	/* Requests are refused while starting. */
	bad("/v1/completions", "{\"prompt\":\"x\"}", 503, NULL);

	CHECK_OK(fake_start(&fk));
	flare_server_set_ready(srv);
	http_request(port, "GET", "/health", NULL, &r);
	CHECK(r.status == 200);
	json_t *j = parse_json(r.body);
	CHECK(!strcmp(jstr(j, "status"), "ok"));
	json_decref(j);
	char ct[128];
	CHECK(strstr(http_header(&r, "Content-Type", ct, sizeof ct), "application/json"));
	http_resp_free(&r);

	http_request(port, "GET", "/v1/models", NULL, &r);
	CHECK(r.status == 200);
	j = parse_json(r.body);
	CHECK(!strcmp(jstr(j, "data.0.id"), "tiny"));
	json_decref(j);
	http_resp_free(&r);
}

static void test_completion(void)
{
	pthread_mutex_lock(&fk.mu);
	fk.cached = 2;
	fk.gpu = 2;
	pthread_mutex_unlock(&fk.mu);
	json_t *j = post(
		"/v1/completions",
		"{\"model\":\"tiny\",\"prompt\":\"Hi there\",\"max_tokens\":5,\"temperature\":0,"
		"\"seed\":42}",
		200);
	CHECK(!strcmp(jstr(j, "object"), "text_completion"));
	CHECK(!strncmp(jstr(j, "id"), "cmpl-", 5));
	CHECK(!strcmp(jstr(j, "model"), "tiny"));
	CHECK(jint(j, "created") > 1600000000);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "Hello"));
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "length"));
	CHECK(jint(j, "choices.0.index") == 0);
	CHECK(jint(j, "usage.prompt_tokens") == 8);
	CHECK(jint(j, "usage.completion_tokens") == 5);
	CHECK(jint(j, "usage.total_tokens") == 13);
	CHECK(jint(j, "usage.prompt_tokens_details.cached_tokens") == 2);
	CHECK(jint(j, "flare.reused_tokens") == 2);
	CHECK(jint(j, "flare.reused_gpu_tokens") == 2);
	CHECK(jint(j, "flare.reused_host_tokens") == 0);
	CHECK(!strcmp(jstr(j, "flare.source"), "gpu"));
	CHECK(jint(j, "flare.prefill_tokens") == 6);
	CHECK(jint(j, "flare.prefill_launches") == 1);
	json_decref(j);

	/* What the engine was given. */
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_n_prompt == 8);
	for (int i = 0; i < 8; i++)
		CHECK(fk.last_prompt[i] == (hel_token)(unsigned char)"Hi there"[i]);
	CHECK(fk.last_max_tokens == 5);
	CHECK(!fk.last_ignore_eos);
	CHECK(fk.last_sampler.temperature == 0.0);
	CHECK(fk.last_sampler.seed == 42);
	CHECK(!fk.last_has_salt);
	fk.cached = 0;
	fk.gpu = 0;
	fk.host = 7;
	fk.tier = SEL_TIER_DISK;
	pthread_mutex_unlock(&fk.mu);

	/* Defaults: max_tokens is what the context leaves (issue 14 item 1:
	 * not 16); temperature 1. */
	j = post("/v1/completions", "{\"prompt\":\"Hi\",\"user\":\"bob\"}", 200);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "Hello, world!"));
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "stop"));
	CHECK(!strcmp(jstr(j, "flare.source"), "disk"));
	CHECK(jint(j, "flare.reused_host_tokens") == 7);
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_max_tokens == CONTEXT - 2);
	CHECK(fk.last_sampler.temperature == 1.0);
	CHECK(fk.last_has_salt && fk.last_salt_len == 3 && !memcmp(fk.last_salt, "bob", 3));
	fk.host = 0;
	pthread_mutex_unlock(&fk.mu);

	/* ignore_eos (vLLM's extension) reaches the engine. */
	j = post("/v1/completions", "{\"prompt\":\"Hi\",\"ignore_eos\":true}", 200);
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_ignore_eos);
	pthread_mutex_unlock(&fk.mu);

	/* cache_salt wins over user; token-id prompts. */
	j = post(
		"/v1/completions",
		"{\"prompt\":[72,105,256],\"user\":\"bob\",\"cache_salt\":\"tenant-a\",\"max_tokens\":1}",
		200);
	CHECK(!strcmp(jstr(j, "flare.source"), "none"));
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_salt_len == 8 && !memcmp(fk.last_salt, "tenant-a", 8));
	CHECK(fk.last_n_prompt == 3 && fk.last_prompt[2] == HEL_TOK_BEGIN);
	pthread_mutex_unlock(&fk.mu);

	/* The default max_tokens shrinks to the room the context leaves. */
	char body[CONTEXT + 64];
	snprintf(body, sizeof body, "{\"prompt\":\"%0*d\"}", CONTEXT - 3, 0);
	j = post("/v1/completions", body, 200);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "Hel"));
	json_decref(j);
}

static void test_chat(void)
{
	const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
			   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"},"
			   "{\"type\":\"text\",\"text\":\"!\"}]}],\"max_completion_tokens\":4}";
	json_t *j = post("/v1/chat/completions", body, 200);
	CHECK(!strcmp(jstr(j, "object"), "chat.completion"));
	CHECK(!strncmp(jstr(j, "id"), "chatcmpl-", 9));
	CHECK(!strcmp(jstr(j, "choices.0.message.role"), "assistant"));
	CHECK(!strcmp(jstr(j, "choices.0.message.content"), "Hell"));
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "length"));
	json_decref(j);
	hel_message m[2] = {{.role = "system", .content = "Be brief.", .content_len = 9},
			    {.role = "user", .content = "Hi!", .content_len = 3}};
	hel_token want[64];
	size_t n = hel_chat_template(m, 2, true, want, 64);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_n_prompt == n);
	CHECK(!memcmp(fk.last_prompt, want, n * sizeof *want));
	CHECK(fk.last_max_tokens == 4);
	pthread_mutex_unlock(&fk.mu);
}

static void test_stream(void)
{
	static char ev[64][4096];
	struct http_resp r;
	http_request(port, "POST", "/v1/completions",
		     "{\"prompt\":\"Hi\",\"stream\":true,\"max_tokens\":5}", &r);
	CHECK(r.status == 200);
	char ct[128], te[64];
	CHECK(!strcmp(http_header(&r, "Content-Type", ct, sizeof ct), "text/event-stream"));
	CHECK(strstr(http_header(&r, "Transfer-Encoding", te, sizeof te), "chunked"));
	size_t n = sse_events(r.body, ev, 64);
	CHECK(n >= 3);
	CHECK(!strcmp(ev[n - 1], "[DONE]"));
	char text[64] = "";
	const char *id = NULL;
	json_t *first = NULL;
	for (size_t i = 0; i + 1 < n; i++) {
		json_t *j = parse_json(ev[i]);
		CHECK(!strcmp(jstr(j, "object"), "text_completion"));
		if (!first) {
			first = j;
			id = jstr(j, "id");
		} else {
			CHECK(!strcmp(jstr(j, "id"), id)); /* one id for the whole stream */
		}
		CHECK(!jget(j, "usage")); /* no include_usage: no usage field */
		strcat(text, jstr(j, "choices.0.text"));
		json_t *fr = jget(j, "choices.0.finish_reason");
		if (i + 2 < n) {
			CHECK(json_is_null(fr));
		} else {
			CHECK(!strcmp(json_string_value(fr), "length"));
			CHECK(jint(j, "flare.prefill_launches") == 1);
		}
		if (j != first)
			json_decref(j);
	}
	json_decref(first);
	CHECK(!strcmp(text, "Hello"));
	http_resp_free(&r);

	/* Chat with include_usage: role chunk, content deltas, finish, usage. */
	http_request(port, "POST", "/v1/chat/completions",
		     "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true,"
		     "\"stream_options\":{\"include_usage\":true}}",
		     &r);
	CHECK(r.status == 200);
	n = sse_events(r.body, ev, 64);
	CHECK(!strcmp(ev[n - 1], "[DONE]"));
	json_t *j = parse_json(ev[0]);
	CHECK(!strcmp(jstr(j, "object"), "chat.completion.chunk"));
	CHECK(!strcmp(jstr(j, "choices.0.delta.role"), "assistant"));
	CHECK(json_is_null(jget(j, "usage")) && jget(j, "usage"));
	json_decref(j);
	text[0] = '\0';
	for (size_t i = 1; i + 3 < n; i++) {
		j = parse_json(ev[i]);
		strcat(text, jstr(j, "choices.0.delta.content"));
		CHECK(json_is_null(jget(j, "choices.0.finish_reason")));
		json_decref(j);
	}
	CHECK(!strcmp(text, "Hello, world!"));
	j = parse_json(ev[n - 3]);
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "stop"));
	CHECK(json_object_size(jget(j, "choices.0.delta")) == 0);
	json_decref(j);
	j = parse_json(ev[n - 2]);
	CHECK(json_array_size(jget(j, "choices")) == 0);
	CHECK(jint(j, "usage.completion_tokens") == 13);
	CHECK(jint(j, "usage.total_tokens") == jint(j, "usage.prompt_tokens") + 13);
	CHECK(jint(j, "usage.prompt_tokens_details.cached_tokens") == 0);
	CHECK(!strcmp(jstr(j, "flare.source"), "none"));
	json_decref(j);
	http_resp_free(&r);
}

static void test_utf8(void)
{
	/* Generated bytes need not be UTF-8: split characters are held back in
	 * streams, invalid bytes become U+FFFD. */
	pthread_mutex_lock(&fk.mu);
	fk.reply = "caf\xc3\xa9 \xff!";
	pthread_mutex_unlock(&fk.mu);
	json_t *j = post("/v1/completions", "{\"prompt\":\"x\"}", 200);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "caf\xc3\xa9 \xef\xbf\xbd!"));
	json_decref(j);
	static char ev[64][4096];
	struct http_resp r;
	http_request(port, "POST", "/v1/completions", "{\"prompt\":\"x\",\"stream\":true}", &r);
	size_t n = sse_events(r.body, ev, 64);
	char text[64] = "";
	for (size_t i = 0; i + 1 < n; i++) {
		j = parse_json(ev[i]); /* would fail on invalid UTF-8 */
		strcat(text, jstr(j, "choices.0.text"));
		json_decref(j);
	}
	CHECK(!strcmp(text, "caf\xc3\xa9 \xef\xbf\xbd!"));
	http_resp_free(&r);
	pthread_mutex_lock(&fk.mu);
	fk.reply = "Hello, world!";
	pthread_mutex_unlock(&fk.mu);
}

/* SSE events of a streamed POST; returns their count (the last is [DONE]). */
static size_t stream_post(const char *path, const char *body, char ev[][4096], size_t cap)
{
	struct http_resp r;
	http_request(port, "POST", path, body, &r);
	CHECKF(r.status == 200, "%s: %d %s", body, r.status, r.body);
	size_t n = sse_events(r.body, ev, cap);
	CHECK(n >= 2 && !strcmp(ev[n - 1], "[DONE]"));
	http_resp_free(&r);
	return n;
}

/* Item 1: without max_tokens a chat reply runs to its end or the context,
 * not 16 tokens. */
static void test_default_max_tokens(void)
{
	pthread_mutex_lock(&fk.mu);
	fk.reply = "A reply longer than sixteen tokens, as chat replies are.";
	pthread_mutex_unlock(&fk.mu);
	json_t *j = post("/v1/chat/completions",
			 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}", 200);
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "stop"));
	CHECK(!strcmp(jstr(j, "choices.0.message.content"),
		      "A reply longer than sixteen tokens, as chat replies are."));
	uint32_t n_prompt = (uint32_t)jint(j, "usage.prompt_tokens");
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_max_tokens == CONTEXT - n_prompt);
	fk.reply = "Hello, world!";
	pthread_mutex_unlock(&fk.mu);
}

/* Item 2: stop sequences, matched across tokens (one byte each here),
 * never returned, finish_reason stop; the engine is told to stop there. */
static void test_stop(void)
{
	static char ev[64][4096];
	pthread_mutex_lock(&fk.mu);
	unsigned stops = fk.stop_requests;
	pthread_mutex_unlock(&fk.mu);
	json_t *j = post("/v1/completions", "{\"prompt\":\"x\",\"stop\":\", w\"}", 200);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "Hello"));
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "stop"));
	CHECK(jint(j, "usage.completion_tokens") == 8); /* "Hello, w": up to the stop's end */
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.stop_requests == stops + 1);
	pthread_mutex_unlock(&fk.mu);

	/* An array: the earliest occurrence wins; chat too. */
	j = post(
		"/v1/chat/completions",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stop\":[\"xyz\",\"orld\",\"lo,\"]}",
		200);
	CHECK(!strcmp(jstr(j, "choices.0.message.content"), "Hel"));
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "stop"));
	json_decref(j);

	/* A stop that never completes: the text is whole, the finish natural;
	 * one reached only with max_tokens: length. */
	j = post("/v1/completions", "{\"prompt\":\"x\",\"stop\":[\"!?\"]}", 200);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "Hello, world!"));
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "stop"));
	json_decref(j);
	j = post("/v1/completions", "{\"prompt\":\"x\",\"stop\":\"world\",\"max_tokens\":9}", 200);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "Hello, wo"));
	CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "length"));
	json_decref(j);

	/* Streams hold back what could begin a stop sequence: no event ever
	 * carries the 'o' of "o, w" although "Hello" arrives whole first. */
	size_t n = stream_post("/v1/completions",
			       "{\"prompt\":\"x\",\"stream\":true,\"stop\":[\"o, w\"]}", ev, 64);
	char text[64] = "";
	for (size_t i = 0; i + 1 < n; i++) {
		j = parse_json(ev[i]);
		const char *t = jstr(j, "choices.0.text");
		CHECKF(!strchr(t, 'o'), "stop text streamed: %s", ev[i]);
		strcat(text, t);
		if (i + 2 == n)
			CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "stop"));
		json_decref(j);
	}
	CHECK(!strcmp(text, "Hell"));
	/* A held-back prefix that did not become a stop is sent at the end. */
	n = stream_post("/v1/chat/completions",
			"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true,"
			"\"stop\":[\"!!\"]}",
			ev, 64);
	text[0] = '\0';
	for (size_t i = 1; i + 2 < n; i++) {
		j = parse_json(ev[i]);
		strcat(text, jstr(j, "choices.0.delta.content"));
		json_decref(j);
	}
	CHECK(!strcmp(text, "Hello, world!"));
}

/* Item 3: completions prompts as a list of strings (even of one), a list
 * of token ids, a list of lists; n for both endpoints; each choice its own
 * index; the siblings of a prompt branch from its first choice. */
static void test_choices(void)
{
	static char ev[64][4096];
	json_t *j = post("/v1/completions", "{\"prompt\":[\"Hi\"],\"max_tokens\":2}", 200);
	CHECK(json_array_size(jget(j, "choices")) == 1);
	CHECK(!strcmp(jstr(j, "choices.0.text"), "He"));
	json_decref(j);

	pthread_mutex_lock(&fk.mu);
	unsigned first = fk.submitted;
	pthread_mutex_unlock(&fk.mu);
	j = post(
		"/v1/completions",
		"{\"prompt\":[\"Hi\",\"Yo!\"],\"n\":2,\"max_tokens\":3,\"seed\":42,\"temperature\":0.5}",
		200);
	json_t *ch = jget(j, "choices");
	CHECK(json_array_size(ch) == 4);
	for (int i = 0; i < 4; i++) {
		char path[32];
		snprintf(path, sizeof path, "choices.%d.index", i);
		CHECK(jint(j, path) == i);
		snprintf(path, sizeof path, "choices.%d.text", i);
		CHECK(!strcmp(jstr(j, path), "Hel"));
	}
	CHECK(jint(j, "usage.prompt_tokens") == 5);      /* each prompt once */
	CHECK(jint(j, "usage.completion_tokens") == 12); /* every choice */
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.submitted == first + 4);
	/* Choice 0 and 2 lead their prompts; 1 and 3 follow them. */
	CHECK(fk.afters[first] == 0 && fk.afters[first + 1] == fk.ids[first]);
	CHECK(fk.afters[first + 2] == 0 && fk.afters[first + 3] == fk.ids[first + 2]);
	/* A seed gives each choice of a prompt its own (seed + j). */
	CHECK(fk.seeds[first] == 42 && fk.seeds[first + 1] == 43);
	CHECK(fk.seeds[first + 2] == 42 && fk.seeds[first + 3] == 43);
	pthread_mutex_unlock(&fk.mu);

	j = post("/v1/completions", "{\"prompt\":[[72,105],[89]],\"max_tokens\":1}", 200);
	CHECK(json_array_size(jget(j, "choices")) == 2);
	CHECK(jint(j, "usage.prompt_tokens") == 3);
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_n_prompt == 1 && fk.last_prompt[0] == 89);
	pthread_mutex_unlock(&fk.mu);

	j = post("/v1/chat/completions",
		 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"n\":3,\"max_tokens\":2}",
		 200);
	CHECK(json_array_size(jget(j, "choices")) == 3);
	CHECK(jint(j, "choices.2.index") == 2);
	CHECK(!strcmp(jstr(j, "choices.2.message.content"), "He"));
	json_decref(j);

	/* Streams: every choice's chunks carry its index, each ends once. */
	size_t n = stream_post(
		"/v1/chat/completions",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"n\":2,"
		"\"max_tokens\":4,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
		ev, 64);
	char text[2][32] = {"", ""};
	int roles[2] = {0, 0}, finishes[2] = {0, 0};
	for (size_t i = 0; i + 2 < n; i++) {
		j = parse_json(ev[i]);
		long long k = jint(j, "choices.0.index");
		CHECK(k == 0 || k == 1);
		if (jget(j, "choices.0.delta.role"))
			roles[k]++;
		else if (jget(j, "choices.0.delta.content"))
			strcat(text[k], jstr(j, "choices.0.delta.content"));
		if (json_is_string(jget(j, "choices.0.finish_reason")))
			finishes[k]++;
		json_decref(j);
	}
	CHECK(roles[0] == 1 && roles[1] == 1 && finishes[0] == 1 && finishes[1] == 1);
	CHECK(!strcmp(text[0], "Hell") && !strcmp(text[1], "Hell"));
	j = parse_json(ev[n - 2]);
	CHECK(jint(j, "usage.completion_tokens") == 8);
	json_decref(j);

	/* One choice refused by the engine: the request fails, the choices
	 * already submitted are cancelled. */
	pthread_mutex_lock(&fk.mu);
	fk.fail_at = fk.submitted + 2;
	fk.hold = true; /* the first cannot finish before the second fails */
	unsigned cancels = fk.cancels;
	pthread_mutex_unlock(&fk.mu);
	bad("/v1/completions", "{\"prompt\":\"x\",\"n\":3}", 503, NULL);
	CHECK(fake_wait(&fk, &fk.cancels, cancels + 1, 5000));
	pthread_mutex_lock(&fk.mu);
	fk.hold = false;
	pthread_cond_broadcast(&fk.cv);
	pthread_mutex_unlock(&fk.mu);
	CHECK(fake_wait(&fk, &fk.finished, fk.submitted, 5000));
}

/* Logprobs from the engine in OpenAI's two shapes (the fake's values:
 * -(t % 8) / 4, alternatives t, t + 1, ... each 1 lower). */
static void test_logprobs(void)
{
	static char ev[64][4096];
	json_t *j =
		post("/v1/completions", "{\"prompt\":\"x\",\"max_tokens\":3,\"logprobs\":2}", 200);
	pthread_mutex_lock(&fk.mu);
	CHECK(fk.last_logprobs && fk.last_top_logprobs == 2);
	pthread_mutex_unlock(&fk.mu);
	CHECK(json_array_size(jget(j, "choices.0.logprobs.tokens")) == 3);
	CHECK(!strcmp(jstr(j, "choices.0.logprobs.tokens.1"), "e"));
	CHECK(json_real_value(jget(j, "choices.0.logprobs.token_logprobs.1")) ==
	      -1.25); /* 'e' = 101 */
	CHECK(jint(j, "choices.0.logprobs.text_offset.2") == 2);
	json_t *top = jget(j, "choices.0.logprobs.top_logprobs.0"); /* 'H': H, I */
	CHECK(json_object_size(top) == 2);
	CHECK(json_real_value(json_object_get(top, "H")) == 0.0);
	CHECK(json_real_value(json_object_get(top, "I")) == -1.0);
	json_decref(j);

	j = post("/v1/chat/completions",
		 "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"logprobs\":true,"
		 "\"top_logprobs\":3,\"stop\":\"lo\"}",
		 200);
	CHECK(!strcmp(jstr(j, "choices.0.message.content"), "Hel"));
	json_t *content = jget(j, "choices.0.logprobs.content");
	CHECK(json_array_size(content) == 3); /* the stop's tokens are not shown */
	CHECK(!strcmp(jstr(j, "choices.0.logprobs.content.0.token"), "H"));
	CHECK(jint(j, "choices.0.logprobs.content.0.bytes.0") == 72);
	CHECK(json_array_size(jget(j, "choices.0.logprobs.content.2.top_logprobs")) == 3);
	CHECK(!strcmp(jstr(j, "choices.0.logprobs.content.2.top_logprobs.1.token"), "m"));
	CHECK(json_is_null(jget(j, "choices.0.logprobs.refusal")));
	json_decref(j);
	/* Without logprobs, null. */
	j = post("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}]}",
		 200);
	CHECK(json_is_null(jget(j, "choices.0.logprobs")));
	json_decref(j);
	pthread_mutex_lock(&fk.mu);
	CHECK(!fk.last_logprobs);
	pthread_mutex_unlock(&fk.mu);

	/* Streamed: each chunk carries the entries of its own text. */
	size_t n = stream_post(
		"/v1/chat/completions",
		"{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"logprobs\":true,"
		"\"stream\":true,\"max_tokens\":4}",
		ev, 64);
	size_t entries = 0;
	for (size_t i = 1; i + 2 < n; i++) {
		j = parse_json(ev[i]);
		const char *t = jstr(j, "choices.0.delta.content");
		json_t *c = jget(j, "choices.0.logprobs.content");
		CHECK(json_array_size(c) == strlen(t));
		for (size_t k = 0; k < json_array_size(c); k++)
			CHECK(!strncmp(
				json_string_value(json_object_get(json_array_get(c, k), "token")),
				t + k, 1));
		entries += json_array_size(c);
		json_decref(j);
	}
	CHECK(entries == 4);
}

/* Item 7: GET /v1/models/{id}, as models.retrieve() asks. */
static void test_model_retrieve(void)
{
	struct http_resp r;
	http_request(port, "GET", "/v1/models/tiny", NULL, &r);
	CHECK(r.status == 200);
	json_t *j = parse_json(r.body);
	CHECK(!strcmp(jstr(j, "id"), "tiny") && !strcmp(jstr(j, "object"), "model"));
	CHECK(!strcmp(jstr(j, "owned_by"), "flare") && jint(j, "created") > 1600000000);
	json_decref(j);
	http_resp_free(&r);
	http_request(port, "GET", "/v1/models/gpt-4o", NULL, &r);
	CHECK(r.status == 404);
	j = parse_json(r.body);
	CHECK(!strcmp(jstr(j, "error.code"), "model_not_found") &&
	      !strcmp(jstr(j, "error.param"), "model"));
	json_decref(j);
	http_resp_free(&r);
	http_request(port, "POST", "/v1/models/tiny", "{}", &r);
	CHECK(r.status == 405);
	http_resp_free(&r);
}

static void test_bad_requests(void)
{
	const char *C = "/v1/completions", *T = "/v1/chat/completions";
	bad(C, "{\"prompt\": \"x\"", 400, NULL);
	bad(C, "", 400, NULL);
	bad(C, "[1,2]", 400, NULL);
	bad(C, "\"text\"", 400, NULL);
	bad(C, "{}", 400, "prompt");
	bad(C, "{\"prompt\":null}", 400, "prompt");
	bad(C, "{\"prompt\":5}", 400, "prompt");
	bad(C, "{\"prompt\":\"\"}", 400, "prompt");
	bad(C, "{\"prompt\":[]}", 400, "prompt");
	bad(C, "{\"prompt\":[\"a\",5]}", 400, "prompt[1]");
	bad(C, "{\"prompt\":[\"a\",\"\"]}", 400, "prompt[1]");
	bad(C, "{\"prompt\":[[1,2],[]]}", 400, "prompt[1]");
	bad(C, "{\"prompt\":[[1,2],[3,99999]]}", 400, "prompt[1][1]");
	bad(C, "{\"prompt\":[true]}", 400, "prompt");
	bad(C, "{\"prompt\":[1,99999]}", 400, "prompt[1]");
	bad(C, "{\"prompt\":[1,-1]}", 400, "prompt[1]");
	bad(C, "{\"prompt\":\"x\",\"max_tokens\":0}", 400, "max_tokens");
	bad(C, "{\"prompt\":\"x\",\"max_tokens\":-3}", 400, "max_tokens");
	bad(C, "{\"prompt\":\"x\",\"max_tokens\":\"5\"}", 400, "max_tokens");
	bad(C, "{\"prompt\":\"x\",\"max_tokens\":1.5}", 400, "max_tokens");
	bad(C, "{\"prompt\":\"x\",\"max_tokens\":1000}", 400, "max_tokens");
	bad(C, "{\"prompt\":\"x\",\"temperature\":\"hot\"}", 400, "temperature");
	bad(C, "{\"prompt\":\"x\",\"temperature\":-0.5}", 400, "temperature");
	bad(C, "{\"prompt\":\"x\",\"temperature\":3}", 400, "temperature");
	bad(C, "{\"prompt\":\"x\",\"seed\":\"s\"}", 400, "seed");
	bad(C, "{\"prompt\":\"x\",\"seed\":1.5}", 400, "seed");
	bad(C, "{\"prompt\":\"x\",\"stream\":\"yes\"}", 400, "stream");
	bad(C, "{\"prompt\":\"x\",\"ignore_eos\":1}", 400, "ignore_eos");
	bad(C, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":5}", 400, "stream_options");
	bad(C, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include_usage\":1}}", 400,
	    "stream_options.include_usage");
	bad(C, "{\"prompt\":\"x\",\"n\":0}", 400, "n");
	bad(C, "{\"prompt\":\"x\",\"n\":17}", 400, "n");
	bad(C, "{\"prompt\":\"x\",\"n\":2,\"best_of\":3}", 400, "best_of");
	bad(C, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\",\"g\",\"h\",\"i\"],\"n\":16}", 400,
	    "n"); /* 144 choices */
	bad(C, "{\"prompt\":\"x\",\"stop\":5}", 400, "stop");
	bad(C, "{\"prompt\":\"x\",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop");
	bad(C, "{\"prompt\":\"x\",\"stop\":[\"a\",\"\"]}", 400, "stop[1]");
	bad(C, "{\"prompt\":\"x\",\"stop\":[\"a\",7]}", 400, "stop[1]");
	bad(C, "{\"prompt\":\"x\",\"echo\":true}", 400, "echo");
	bad(C, "{\"prompt\":\"x\",\"logprobs\":21}", 400, "logprobs");
	bad(C, "{\"prompt\":\"x\",\"logprobs\":true}", 400, "logprobs");
	bad(C, "{\"prompt\":\"x\",\"top_logprobs\":2}", 400, "top_logprobs"); /* chat's */
	bad(C, "{\"prompt\":\"x\",\"suffix\":\"end\"}", 400, "suffix");
	bad(C, "{\"prompt\":\"x\",\"top_p\":0.9}", 400, "top_p");
	bad(C, "{\"prompt\":\"x\",\"presence_penalty\":0.5}", 400, "presence_penalty");
	bad(C, "{\"prompt\":\"x\",\"frequency_penalty\":-1}", 400, "frequency_penalty");
	/* Item 10: what would change the result is refused, naming the field. */
	bad(C, "{\"prompt\":\"x\",\"logit_bias\":{\"50\":-100}}", 400, "logit_bias");
	bad(C, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":true}}", 400,
	    "stream_options");
	bad(C, "{\"prompt\":\"x\",\"top_k\":5}", 400, "top_k"); /* unknown: refused */
	bad(C, "{\"prompt\":\"x\",\"max_token\":5}", 400, "max_token");
	bad(C, "{\"prompt\":\"x\",\"stream\":true,\"stream_options\":{\"include\":true}}", 400,
	    "stream_options.include");
	bad(C, "{\"prompt\":\"x\",\"cache_salt\":5}", 400, "cache_salt");
	bad(C, "{\"prompt\":\"x\",\"cache_salt\":\"\"}", 400, "cache_salt");
	bad(C, "{\"prompt\":\"x\",\"user\":[1]}", 400, "user");
	bad(C, "{\"prompt\":\"x\",\"model\":7}", 400, "model");
	bad(C, "{\"prompt\":\"x\",\"model\":\"gpt-4\"}", 404, "model");
	bad(C, "{\"prompt\":\"x\",\"prompt\":\"y\"}", 400, NULL); /* duplicate key */
	/* Over the context: the prompt alone, then prompt plus max_tokens. */
	char body[4 * CONTEXT];
	snprintf(body, sizeof body, "{\"prompt\":\"%0*d\"}", CONTEXT, 0);
	bad(C, body, 400, "prompt");
	snprintf(body, sizeof body, "{\"prompt\":\"%0*d\",\"max_tokens\":11}", CONTEXT - 10, 0);
	bad(C, body, 400, "max_tokens");
	snprintf(body, sizeof body, "{\"prompt\":\"%0*d\",\"max_tokens\":10}", CONTEXT - 10, 0);
	json_decref(post(C, body, 200));

	bad(T, "{}", 400, "messages");
	bad(T, "{\"prompt\":\"x\"}", 400, "prompt"); /* a completions field */
	bad(T, "{\"messages\":\"hi\"}", 400, "messages");
	bad(T, "{\"messages\":[]}", 400, "messages");
	bad(T, "{\"messages\":[5]}", 400, "messages[0]");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"content\":\"x\"}]}", 400,
	    "messages[1].role");
	bad(T, "{\"messages\":[{\"role\":5,\"content\":\"x\"}]}", 400, "messages[0].role");
	bad(T, "{\"messages\":[{\"role\":\"\",\"content\":\"x\"}]}", 400, "messages[0].role");
	bad(T, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400, "messages[0].role");
	bad(T,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"tool\","
	    "\"content\":\"y\"}]}",
	    400, "messages[1].role");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"name\":\"bob\"}]}", 400,
	    "messages[0].name");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\",\"colour\":1}]}", 400,
	    "messages[0].colour");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}",
	    400, "tool_choice");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logit_bias\":{\"1\":5}}",
	    400, "logit_bias");
	bad(T,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":"
	    "{\"include_usage\":true}}",
	    400, "stream_options");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":3}", 400,
	    "top_logprobs"); /* without logprobs */
	bad(T,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,"
	    "\"top_logprobs\":21}",
	    400, "top_logprobs");
	bad(T,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
	    "{\"type\":\"json_object\"}}",
	    400, "response_format");
	bad(T,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"reasoning_effort\":\"low\"}",
	    400, "reasoning_effort");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"suffix\":\"\"}", 400,
	    "suffix"); /* a completions field */
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"metadata\":5}", 400,
	    "metadata");
	/* Harmless fields are accepted (docs/configuration.md lists them). */
	json_decref(post(
		T,
		"{\"messages\":[{\"role\":\"developer\",\"content\":\"x\"},{\"role\":"
		"\"assistant\",\"content\":\"y\",\"refusal\":null}],\"user\":\"u\",\"metadata\":"
		"{\"k\":\"v\"},\"store\":false,\"service_tier\":\"auto\",\"parallel_tool_calls\":"
		"true,\"tool_choice\":\"none\",\"tools\":[],\"top_p\":1,\"presence_penalty\":0,"
		"\"frequency_penalty\":0,\"logit_bias\":{},\"prompt_cache_key\":\"p\","
		"\"safety_identifier\":\"s\",\"modalities\":[\"text\"],\"n\":1}",
		200));
	json_decref(post(C,
			 "{\"prompt\":\"x\",\"best_of\":1,\"echo\":false,\"suffix\":null,"
			 "\"logprobs\":null,\"stop\":[],\"store\":true,\"metadata\":{}}",
			 200));
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400, "messages[0].content");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
	    "messages[0].content[0]");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":0}",
	    400, "max_completion_tokens");
	bad(T, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{}]}", 400,
	    "tools");
	snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%0*d\"}]}",
		 CONTEXT, 0);
	bad(T, body, 400, "messages");

	/* Paths and methods. */
	struct http_resp r;
	http_request(port, "GET", "/v1/nothing", NULL, &r);
	CHECK(r.status == 404);
	json_decref(parse_json(r.body));
	http_resp_free(&r);
	http_request(port, "POST", "/", "{}", &r);
	CHECK(r.status == 404);
	http_resp_free(&r);
	http_request(port, "GET", "/v1/completions", NULL, &r);
	CHECK(r.status == 405);
	char allow[64];
	CHECK(!strcmp(http_header(&r, "Allow", allow, sizeof allow), "POST, OPTIONS"));
	json_decref(parse_json(r.body));
	http_resp_free(&r);
	http_request(port, "POST", "/health", "{}", &r);
	CHECK(r.status == 405);
	http_resp_free(&r);
	http_request(port, "DELETE", "/metrics", NULL, &r);
	CHECK(r.status == 405);
	http_resp_free(&r);

	/* The engine refusing: queue full, and its own validation. */
	pthread_mutex_lock(&fk.mu);
	fk.submit_rc = -EAGAIN;
	pthread_mutex_unlock(&fk.mu);
	http_request(port, "POST", C, "{\"prompt\":\"x\"}", &r);
	CHECK(r.status == 503);
	char ra[16];
	CHECK(!strcmp(http_header(&r, "Retry-After", ra, sizeof ra), "1"));
	http_resp_free(&r);
	pthread_mutex_lock(&fk.mu);
	fk.submit_rc = -EINVAL;
	pthread_mutex_unlock(&fk.mu);
	bad(C, "{\"prompt\":\"x\"}", 400, "prompt");
	pthread_mutex_lock(&fk.mu);
	fk.submit_rc = 0;
	pthread_mutex_unlock(&fk.mu);
}

static void test_body_limit(void)
{
	/* Announced too large: refused at once. */
	struct http_resp r;
	const char *big = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			  "Content-Length: 10000000\r\n\r\n";
	http_exchange(port, big, strlen(big), &r);
	CHECK(r.status == 413);
	json_decref(parse_json(r.body));
	http_resp_free(&r);

	/* Chunked, and only too large once it has arrived. */
	struct flare_buf req = {0};
	flare_buf_puts(&req, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			     "Transfer-Encoding: chunked\r\n\r\n");
	char chunk[4096];
	memset(chunk, ' ', sizeof chunk);
	for (int i = 0; i < 20; i++) {
		flare_buf_printf(&req, "%zx\r\n", sizeof chunk);
		flare_buf_append(&req, chunk, sizeof chunk);
		flare_buf_puts(&req, "\r\n");
	}
	flare_buf_puts(&req, "0\r\n\r\n");
	http_exchange(port, req.data, req.len, &r);
	CHECK(r.status == 413);
	http_resp_free(&r);
	flare_buf_free(&req);

	/* Under the limit, chunked: fine. */
	const char *ok = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			 "Transfer-Encoding: chunked\r\n\r\n"
			 "8\r\n{\"prompt\r\n9\r\n\":\"Hi\"} \r\n0\r\n\r\n";
	http_exchange(port, ok, strlen(ok), &r);
	CHECKF(r.status == 200, "%d %s", r.status, r.body);
	http_resp_free(&r);
}

static void test_metrics(void)
{
	pthread_mutex_lock(&fk.mu);
	fk.stats.store_enabled = true;
	fk.stats.store.slots_total = 512;
	fk.stats.store.tier[SEL_TIER_DISK].held = 9;
	fk.stats.prefill_launches = 77;
	pthread_mutex_unlock(&fk.mu);
	struct http_resp r;
	http_request(port, "GET", "/metrics", NULL, &r);
	CHECK(r.status == 200);
	char ct[128];
	CHECK(strstr(http_header(&r, "Content-Type", ct, sizeof ct), "text/plain"));
	prom_check(r.body);
	static const char *const names[] = {
		"flare_host_cache_slots_in_use",
		"flare_host_cache_slots_capacity",
		"flare_host_cache_intake_slots",
		"flare_host_cache_held_total{tier=\"dram\"}",
		"flare_host_cache_dropped_total{tier=\"nvme\",reason=\"io_error\"}",
		"flare_host_cache_parked_records",
		"flare_host_cache_store_outcomes_total{outcome=\"queued\"}",
		"flare_host_cache_retry_abandoned_total{reason=\"budget\"}",
		"flare_host_cache_lookups_total",
		"flare_host_cache_hits_total",
		"flare_host_cache_reused_tokens_total",
		"flare_host_cache_inbound_waiting",
		"flare_host_cache_bytes_in_total{tier=\"dram\"}",
		"flare_host_cache_bytes_out_total{tier=\"nvme\"}",
		"flare_host_cache_transfer_rate_bytes_per_second{tier=\"nvme\"}",
		"flare_host_cache_expired_total{tier=\"dram\"}",
		"flare_host_cache_records{tier=\"nvme\"}",
		"flare_prefill_launches_total",
		"flare_prefill_tokens_total",
		"flare_decode_tokens_total",
		"flare_requests_submitted_total",
		"flare_requests_active",
		"flare_gpu_cache_pages_free",
		"flare_http_requests_total",
		"flare_http_client_disconnects_total",
		"flare_info{",
	};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		CHECKF(strstr(r.body, names[i]), "/metrics lacks %s", names[i]);
	CHECK(strstr(r.body, "\nflare_host_cache_slots_capacity 512\n"));
	CHECK(strstr(r.body, "\nflare_host_cache_held_total{tier=\"nvme\"} 9\n"));
	CHECK(strstr(r.body, "\nflare_prefill_launches_total 77\n"));
	CHECK(strstr(
		r.body,
		"flare_info{model=\"tiny\",speculate=\"off\",store=\"memory\",transport=\"host\"} 1"));
	http_resp_free(&r);
}

/* Read from fd until buf holds needle; false on EOF or timeout. */
static bool read_until(int fd, char *buf, size_t *len, size_t cap, const char *needle)
{
	while (!strstr(buf, needle))
		if (!http_read_some(fd, buf, len, cap, 10000))
			return false;
	return true;
}

/* Both disconnects counted and the stream's end accounted for. */
static bool disconnects_settled(void)
{
	struct flare_http_stats h;
	flare_server_http_stats(srv, &h);
	return h.disconnects >= 2 && h.streams_active == 0;
}

static void test_disconnect(void)
{
	pthread_mutex_lock(&fk.mu);
	fk.hold = true;
	unsigned cancels = fk.cancels, submitted = fk.submitted, tokens = fk.tokens;
	pthread_mutex_unlock(&fk.mu);

	/* Mid-stream: the first token arrives, then the client goes. */
	const char *body = "{\"prompt\":\"Hi\",\"stream\":true}";
	char req[512];
	int n = snprintf(
		req, sizeof req,
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
		strlen(body), body);
	int fd = http_connect(port);
	http_send(fd, req, (size_t)n);
	char buf[8192] = "";
	size_t len = 0;
	CHECKF(read_until(fd, buf, &len, sizeof buf, "\"text\":\"H\""), "no first token: %s", buf);
	close(fd);
	CHECKF(fake_wait(&fk, &fk.cancels, cancels + 1, 5000), "stream disconnect did not cancel");

	/* Waiting for a plain answer: the client goes before any reply. */
	body = "{\"prompt\":\"Hi\"}";
	n = snprintf(req, sizeof req,
		     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %zu\r\n\r\n%s",
		     strlen(body), body);
	fd = http_connect(port);
	http_send(fd, req, (size_t)n);
	CHECK(fake_wait(&fk, &fk.submitted, submitted + 2, 5000));
	/* Its one token (the fake holds it after that) has landed. */
	CHECK(fake_wait(&fk, &fk.tokens, tokens + 2, 5000));
	close(fd);
	CHECKF(fake_wait(&fk, &fk.cancels, cancels + 2, 5000), "plain disconnect did not cancel");

	pthread_mutex_lock(&fk.mu);
	fk.hold = false;
	pthread_mutex_unlock(&fk.mu);
	CHECK(fake_wait(&fk, &fk.finished, fk.submitted, 5000));
	/* The server counts a disconnect (and a stream's end) once its cancel
	 * returned, which is after the fake saw it: the counts may trail the
	 * cancels by a moment. */
	TEST_UNTIL(disconnects_settled(), 10);
	struct flare_http_stats h;
	flare_server_http_stats(srv, &h);
	CHECK(h.disconnects == 2);
	CHECK(h.streams_active == 0);
}

struct client {
	pthread_t t;
	int i;
	bool ok;
};

static void *client_main(void *arg)
{
	struct client *c = arg;
	static __thread char ev[64][4096];
	char body[128];
	snprintf(body, sizeof body, "{\"prompt\":\"client %d\",\"stream\":%s}", c->i,
		 c->i % 2 ? "true" : "false");
	struct http_resp r;
	http_request(port, "POST", "/v1/completions", body, &r);
	if (c->i % 2) {
		size_t n = sse_events(r.body, ev, 64);
		c->ok = r.status == 200 && n >= 2 && !strcmp(ev[n - 1], "[DONE]");
	} else {
		c->ok = r.status == 200 && strstr(r.body, "\"Hello, world!\"");
	}
	http_resp_free(&r);
	return NULL;
}

static void test_concurrent(void)
{
	pthread_mutex_lock(&fk.mu);
	fk.delay_us = 200;
	pthread_mutex_unlock(&fk.mu);
	struct client c[8];
	for (int i = 0; i < 8; i++) {
		c[i].i = i;
		c[i].ok = false;
		CHECK(pthread_create(&c[i].t, NULL, client_main, &c[i]) == 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(c[i].t, NULL);
		CHECKF(c[i].ok, "client %d failed", i);
	}
	pthread_mutex_lock(&fk.mu);
	fk.delay_us = 0;
	pthread_mutex_unlock(&fk.mu);
}

/* Shutdown in flare_serve's order with one plain and one streamed request
 * held after their first token: begin_stop (503 for new), backend stop
 * (both finish "abort"), server stop. */
static void test_shutdown(void)
{
	pthread_mutex_lock(&fk.mu);
	fk.hold = true;
	unsigned submitted = fk.submitted, tokens = fk.tokens;
	pthread_mutex_unlock(&fk.mu);
	const char *bodies[2] = {"{\"prompt\":\"Hi\"}", "{\"prompt\":\"Hi\",\"stream\":true}"};
	int fds[2];
	for (int i = 0; i < 2; i++) {
		char req[256];
		int n = snprintf(req, sizeof req,
				 "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
				 "Content-Length: %zu\r\n\r\n%s",
				 strlen(bodies[i]), bodies[i]);
		fds[i] = http_connect(port);
		http_send(fds[i], req, (size_t)n);
	}
	CHECK(fake_wait(&fk, &fk.submitted, submitted + 2, 5000));
	/* Held after their first token: both tokens landed (a request cut
	 * before any token answers 503, not "abort"). */
	CHECK(fake_wait(&fk, &fk.tokens, tokens + 2, 5000));
	flare_server_begin_stop(srv);
	struct http_resp r;
	http_request(port, "GET", "/health", NULL, &r);
	CHECK(r.status == 503 && strstr(r.body, "stopping"));
	http_resp_free(&r);
	http_request(port, "POST", "/v1/completions", "{\"prompt\":\"x\"}", &r);
	CHECK(r.status == 503);
	http_resp_free(&r);

	fake_stop(&fk, 0);
	for (int i = 0; i < 2; i++) {
		char *buf = malloc(1 << 16);
		size_t len = 0;
		buf[0] = '\0';
		while (http_read_some(fds[i], buf, &len, 1 << 16, 10000))
			;
		close(fds[i]);
		struct http_resp pr = {0};
		pr.raw = buf;
		pr.raw_len = len;
		http_parse(&pr);
		/* Item 9: generations cut by shutdown end "abort" (vLLM's value),
		 * with what they generated. */
		if (i == 0) {
			CHECKF(pr.status == 200, "held plain request: %d %s", pr.status, pr.body);
			json_t *j = parse_json(pr.body);
			CHECK(!strcmp(jstr(j, "choices.0.finish_reason"), "abort"));
			CHECK(!strcmp(jstr(j, "choices.0.text"), "H"));
			json_decref(j);
		} else {
			CHECK(pr.status == 200);
			CHECKF(strstr(pr.body, "\"finish_reason\":\"abort\""), "%s", pr.body);
			CHECK(!strstr(pr.body, "cancelled"));
			CHECK(strstr(pr.body, "data: [DONE]\n\n"));
		}
		http_resp_free(&pr);
	}
	flare_server_stop(srv, 2000000000ull);
	flare_server_destroy(srv);
	fake_destroy(&fk);
	srv = NULL;
}

/* A backend that never finishes: stop ends the waiting requests itself;
 * one that generated nothing yet gets 503 (retry elsewhere). */
static void test_stop_aborts(void)
{
	start_server(0);
	CHECK_OK(fake_start(&fk));
	flare_server_set_ready(srv);
	pthread_mutex_lock(&fk.mu);
	fk.hold_all = true;
	pthread_mutex_unlock(&fk.mu);
	int fd = http_connect(port);
	const char *req = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
			  "Content-Length: 15\r\n\r\n{\"prompt\":\"Hi\"}";
	http_send(fd, req, strlen(req));
	CHECK(fake_wait(&fk, &fk.submitted, 1, 5000));
	flare_server_stop(srv, 50000000ull); /* the engine is still running */
	char buf[4096] = "";
	size_t len = 0;
	while (http_read_some(fd, buf, &len, sizeof buf, 5000))
		;
	close(fd);
	CHECKF(!strncmp(buf, "HTTP/1.1 503", 12), "%s", buf);
	CHECK(fake_wait(&fk, &fk.cancels, 1, 5000)); /* its engine request was cancelled */
	fake_stop(&fk, 0);
	flare_server_destroy(srv);
	fake_destroy(&fk);
}

int main(void)
{
	start_server(64 * 1024);
	test_health_and_models();
	test_completion();
	test_chat();
	test_stream();
	test_utf8();
	test_default_max_tokens();
	test_stop();
	test_choices();
	test_logprobs();
	test_model_retrieve();
	test_bad_requests();
	test_body_limit();
	test_metrics();
	test_disconnect();
	test_concurrent();
	test_shutdown();
	test_stop_aborts();
	printf("ok\n");
	return 0;
}
