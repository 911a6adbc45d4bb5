/*
 * test_flare_serve.c - the whole `flare run` path (src/flare/serve.c)
 * against the fake engine: exit statuses of bad invocations, then servers
 * in child processes on port 0 with their stderr read back: the startup
 * summary, the listening line, requests, the dashboard, the disk directory
 * decisions of design 2.11, and a clean exit 0 on SIGTERM and SIGINT.
 *
 * Children are forked before this process starts any thread.
 */
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "flare/serve.h"
#include "flare_testlib.h"

static struct fake fk;
static const struct flare_backend_factory fake_factory = {"fake", fake_open, &fk};

static int serve(const char *first, ...)
{
	char *argv[32];
	int argc = 0;
	argv[argc++] = "run";
	va_list ap;
	va_start(ap, first);
	for (const char *a = first; a; a = va_arg(ap, const char *))
		argv[argc++] = (char *)a;
	va_end(ap);
	argv[argc] = NULL;
	fake_init(&fk);
	return flare_serve(argc, argv, &fake_factory);
}

/* Run flare_serve in a child with stderr (and stdout) into a pipe. */
struct child {
	pid_t pid;
	int fd;
	char out[65536];
	size_t len;
};

static void spawn(struct child *c, char *const argv[])
{
	int p[2];
	CHECK(pipe(p) == 0);
	fflush(NULL);
	c->pid = fork();
	CHECK(c->pid >= 0);
	if (c->pid == 0) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		int argc = 0;
		while (argv[argc])
			argc++;
		fake_init(&fk);
		fk.delay_us = 100;
		/* exit, not _exit: flush stdout and let LeakSanitizer check. */
		exit(flare_serve(argc, (char **)argv, &fake_factory));
	}
	close(p[1]);
	c->fd = p[0];
	c->len = 0;
	c->out[0] = '\0';
}

/* Read the child's output until it contains needle (or it exits). */
static bool wait_output(struct child *c, const char *needle)
{
	while (!strstr(c->out, needle))
		if (!http_read_some(c->fd, c->out, &c->len, sizeof c->out, 20000))
			return false;
	return true;
}

static uint16_t listening_port(struct child *c)
{
	CHECKF(wait_output(c, "listening on http://127.0.0.1:"), "no listening line:\n%s", c->out);
	const char *p = strstr(c->out, "listening on http://127.0.0.1:");
	CHECK(wait_output(c, "\n") && strchr(p, '\n'));
	unsigned port = 0;
	CHECK(sscanf(p, "listening on http://127.0.0.1:%u", &port) == 1);
	CHECK(port > 0 && port < 65536);
	return (uint16_t)port;
}

/* Signal the child and collect its exit status and the rest of its output. */
static int finish(struct child *c, int sig)
{
	if (sig)
		CHECK(kill(c->pid, sig) == 0);
	while (http_read_some(c->fd, c->out, &c->len, sizeof c->out, 20000))
		;
	close(c->fd);
	int st;
	CHECK(waitpid(c->pid, &st, 0) == c->pid);
	CHECKF(WIFEXITED(st), "child died by signal %d:\n%s", WTERMSIG(st), c->out);
	return WEXITSTATUS(st);
}

/* dir/name holding text; its path into path. */
static void write_file(const char *dir, const char *name, const char *text, char *path, size_t cap)
{
	snprintf(path, cap, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	CHECK(f);
	fputs(text, f);
	CHECK(fclose(f) == 0);
}

static void test_exit_statuses(void)
{
	/* Bad flags, files and cores: 2, before anything starts. */
	CHECK(serve("--port", "x", NULL) == 2);
	CHECK(serve("--bogus", NULL) == 2);
	CHECK(serve("--config", "/nonexistent.toml", NULL) == 2);
	CHECK(serve("/nonexistent.core", NULL) == 2);
	CHECK(!fk.opened);
	CHECK(serve("--api-key", "k", "--api-key-file", "/k", NULL) == 2);
	CHECK(serve("--api-key-file", "/nonexistent.key", NULL) == 2);
	char *dir = test_mkdtemp("flare-serve");
	char path[4096];
	write_file(dir, "bad.toml", "[prefix_cache]\nmemory = \"lots\"\n", path, sizeof path);
	CHECK(serve("--config", path, NULL) == 2);
	test_rmtree(dir);
	free(dir);
}

static void test_run(void)
{
	char *dir = test_mkdtemp("flare-serve");
	char cache[4096], conf[4096];
	snprintf(cache, sizeof cache, "%s/cache", dir);
	snprintf(conf, sizeof conf, "%s/flare.toml", dir);
	FILE *f = fopen(conf, "w");
	CHECK(f);
	/* The file asks for port 1 and 8 active requests; the flag's port wins. */
	fprintf(f, "[server]\nport = 1\nmax_active = 8\n[prefix_cache]\nmemory = \"1MiB\"\n");
	fclose(f);
	char *argv[] = {"run", "--config", conf, "--port", "0", "--prefix-cache-disk", cache,
			"--dashboard", "on", "--dashboard-interval", "50ms",
			/* issue 14 item 6: the value after a space */
			"--prefix-cache-drain-on-shutdown", "90s", "--prefix-cache-max-age", "2h",
			NULL};
	struct child c;
	spawn(&c, argv);
	uint16_t port = listening_port(&c);
	const char *want[] = {"flare: core 'tiny'",
			      "max-active 8",
			      "prefix cache: composite store",
			      "transport host",
			      "memory 1 MiB",
			      "directory ",
			      "3 records scanned",
			      "; records expire after 2h unused",
			      "; drain on shutdown for at most 1m30s"};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
		CHECKF(strstr(c.out, want[i]), "startup lacks '%s':\n%s", want[i], c.out);
	struct stat st;
	CHECK(stat(cache, &st) == 0 && S_ISDIR(st.st_mode));

	struct http_resp r;
	http_request(port, "GET", "/health", NULL, &r);
	CHECK(r.status == 200);
	http_resp_free(&r);
	http_request(port, "POST", "/v1/completions", "{\"prompt\":\"Hi\",\"max_tokens\":5}", &r);
	CHECKF(r.status == 200 && strstr(r.body, "\"Hello\""), "%d %s", r.status, r.body);
	http_resp_free(&r);
	http_request(port, "GET", "/metrics", NULL, &r);
	CHECK(r.status == 200);
	prom_check(r.body);
	CHECK(strstr(r.body, "store=\"composite\""));
	http_resp_free(&r);
	CHECKF(wait_output(&c, "pages) | host"), "no dashboard line:\n%s", c.out);

	CHECK(finish(&c, SIGTERM) == 0);
	CHECKF(strstr(c.out, "flare: SIGTERM: stopping") && strstr(c.out, "flare: stopped"), "%s",
	       c.out);
	/* The drain's progress and its final line, on stderr. */
	CHECKF(strstr(c.out, "flare: drain: 2 records (2 MiB) written, 2 MiB/s; 1 writing (1 MiB), "
			     "4 left (4 MiB), 1s\n") &&
		       strstr(c.out,
			      "flare: drain: saved 3 records (3 MiB) in 1.500s, 2 MiB/s; not "
			      "saved 4 records (4 MiB): time limit\n"),
	       "%s", c.out);
	test_rmtree(dir);
	free(dir);
}

static void test_disk_decisions(void)
{
	char *dir = test_mkdtemp("flare-serve");
	char file[4096], sub[4200], never[4096];
	snprintf(file, sizeof file, "%s/file", dir);
	snprintf(sub, sizeof sub, "%s/sub", file);
	snprintf(never, sizeof never, "%s/never", dir);
	FILE *f = fopen(file, "w");
	CHECK(f);
	fclose(f);

	/* Unusable directory: no disk store, the line says why; memory stays. */
	char *a1[] = {"run", "--port", "0", "--prefix-cache-memory", "1MiB", "--prefix-cache-disk",
		      sub,   NULL};
	struct child c;
	spawn(&c, a1);
	listening_port(&c);
	CHECKF(strstr(c.out, "prefix cache: memory store") && strstr(c.out, "no disk store: '") &&
		       strstr(c.out, "not usable"),
	       "%s", c.out);
	CHECK(finish(&c, SIGINT) == 0);
	CHECK(strstr(c.out, "SIGINT: stopping"));

	/* Disk limit 0: no disk store and no directory. */
	char *a2[] = {
		"run", "--port", "0", "--prefix-cache-disk", never, "--prefix-cache-disk-limit",
		"0",   NULL};
	spawn(&c, a2);
	listening_port(&c);
	CHECKF(strstr(c.out, "prefix cache: disabled; no disk store: --prefix-cache-disk-limit 0"),
	       "%s", c.out);
	CHECK(finish(&c, SIGTERM) == 0);
	struct stat st;
	CHECK(stat(never, &st) == -1);
	test_rmtree(dir);
	free(dir);
}

/* Issue 14 item 6: an argument that is not a core file is named as the
 * core file that was not found (it was "flare: 90s: No such file or
 * directory" when a flag's value was taken for CORE). */
static void test_core_not_found(void)
{
	char *argv[] = {"run", "--port", "0", "90x", NULL};
	struct child c;
	spawn(&c, argv);
	CHECK(finish(&c, 0) == 2);
	CHECKF(strstr(c.out, "flare: core file '90x' not found"), "%s", c.out);
}

/* --api-key-file: the key is the file's first line; /health stays open. */
static void test_api_key_file(void)
{
	char *dir = test_mkdtemp("flare-serve");
	char key[4096];
	write_file(dir, "key", "sk-from-file\n", key, sizeof key);
	char *argv[] = {"run", "--port", "0", "--api-key-file", key, NULL};
	struct child c;
	spawn(&c, argv);
	uint16_t port = listening_port(&c);
	CHECK(!strstr(c.out, "sk-from-file"));
	struct http_resp r;
	http_request(port, "GET", "/v1/models", NULL, &r);
	CHECK(r.status == 401);
	http_resp_free(&r);
	int fd = http_connect(port);
	http_send_request(fd, "GET", "/v1/models", "Authorization: Bearer sk-from-file\r\n", NULL);
	CHECK(http_read_response(fd, &r) && r.status == 200);
	http_resp_free(&r);
	close(fd);
	http_request(port, "GET", "/health", NULL, &r);
	CHECK(r.status == 200);
	http_resp_free(&r);
	CHECK(finish(&c, SIGTERM) == 0);
	/* An empty key file is refused, naming the flag and the file. */
	write_file(dir, "key", "", key, sizeof key);
	spawn(&c, argv);
	CHECK(finish(&c, 0) == 2);
	CHECKF(strstr(c.out, "flare: --api-key-file: '") && strstr(c.out, "the key must be"), "%s",
	       c.out);
	test_rmtree(dir);
	free(dir);
}

/* Issue 14 item 8: a busy port is found before the engine and the store
 * start: no startup summary, no namespace directory, the flag and the
 * address named. */
static void test_port_in_use(void)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in a = {0};
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 1) == 0);
	socklen_t l = sizeof a;
	CHECK(getsockname(fd, (struct sockaddr *)&a, &l) == 0);
	char port[16];
	snprintf(port, sizeof port, "%u", ntohs(a.sin_port));
	char *dir = test_mkdtemp("flare-serve");
	char cache[4096];
	snprintf(cache, sizeof cache, "%s/cache", dir);
	char *argv[] = {"run", "--port", port, "--prefix-cache-disk", cache, NULL};
	struct child c;
	spawn(&c, argv);
	CHECK(finish(&c, 0) == 1);
	char want[128];
	snprintf(want, sizeof want, "flare: --port: cannot listen on 127.0.0.1:%s: ", port);
	CHECKF(strstr(c.out, want) && strstr(c.out, "in use"), "%s", c.out);
	CHECKF(!strstr(c.out, "flare: core '") && !strstr(c.out, "prefix cache"), "%s", c.out);
	struct stat st;
	CHECK(stat(cache, &st) == -1 && errno == ENOENT);
	test_rmtree(dir);
	free(dir);
	close(fd);
	/* An address this host does not have: the --host's fault. */
	char *a2[] = {"run", "--port", "0", "--host", "192.0.2.1", NULL};
	spawn(&c, a2);
	CHECK(finish(&c, 0) == 1);
	CHECKF(strstr(c.out, "flare: --host: cannot listen on 192.0.2.1:0: "), "%s", c.out);

	/* --help: exit 0, the text on stdout. */
	char *h[] = {"run", "--help", NULL};
	spawn(&c, h);
	CHECK(finish(&c, 0) == 0);
	CHECK(strstr(c.out, "--prefix-cache-memory SIZE"));
}

/* The drain's lines and durations as the operator reads them. */
static void test_drain_lines(void)
{
	char b[512];
	CHECK(!strcmp(flare_duration_text(90ull * 1000000000, b, sizeof b), "1m30s"));
	CHECK(!strcmp(flare_duration_text(7200ull * 1000000000, b, sizeof b), "2h"));
	CHECK(!strcmp(flare_duration_text(250000000, b, sizeof b), "250ms"));
	CHECK(!strcmp(flare_duration_text(1500000000, b, sizeof b), "1.500s"));
	sel_drain_progress p = {.final = true, .elapsed_ns = 2000000000ull};
	flare_drain_line(b, sizeof b, &p);
	CHECKF(!strcmp(b, "flare: drain: nothing to save (no DRAM-only records)"), "%s", b);
	p.records_written = 1;
	p.bytes_written = 4096;
	p.rate_bps = 2048;
	flare_drain_line(b, sizeof b, &p);
	CHECKF(!strcmp(b, "flare: drain: saved 1 record (4 KiB) in 2s, 2 KiB/s; every DRAM-only "
			  "record saved"),
	       "%s", b);
	p.failed = 2;
	p.why = "write errors";
	flare_drain_line(b, sizeof b, &p);
	CHECKF(strstr(b, "; not saved 2 records (0 B), 2 failed to write: write errors"), "%s", b);
	char small[24];
	flare_drain_line(small, sizeof small, &p);
	CHECK(strlen(small) == sizeof small - 1);
	/* A stop without the drain: what it did not save, and the flag. */
	p = (sel_drain_progress){.final = true,
				 .off = true,
				 .records_left = 20,
				 .bytes_left = 20 * 4096,
				 .why = "drain off"};
	flare_drain_line(b, sizeof b, &p);
	CHECKF(!strcmp(b, "flare: warning: stopped without a drain: 20 DRAM-only records (80 KiB) "
			  "not saved to disk; --prefix-cache-drain-on-shutdown saves them for a "
			  "warm restart"),
	       "%s", b);
}

int main(void)
{
	test_drain_lines();
	test_exit_statuses();
	test_run();
	test_disk_decisions();
	test_port_in_use();
	test_core_not_found();
	test_api_key_file();
	printf("ok\n");
	return 0;
}
