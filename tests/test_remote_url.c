/*
 * test_remote_url.c - the remote tier's URL (src/selene/remote_url.c): the
 * three forms, defaults, IPv6, canonical printing that parses back, and a
 * clear error naming the text for everything else.
 */
#include "remote_url.h"
#include "testutil.h"

static void ok(const char *text, const char *canon)
{
	struct sel_ru_url u, v;
	CHECK_OK(sel_ru_parse(text, &u));
	char buf[SEL_RU_TEXT_MAX];
	CHECK(sel_ru_format(&u, buf, sizeof buf) > 0);
	CHECKF(strcmp(buf, canon) == 0, "'%s' prints as '%s', want '%s'", text, buf, canon);
	CHECK_OK(sel_ru_parse(buf, &v));
	CHECK(memcmp(&u, &v, sizeof u) == 0);
}

static void bad(const char *text, const char *part)
{
	struct sel_ru_url u;
	memset(&u, 0x5a, sizeof u);
	struct sel_ru_url before = u;
	CHECK_RC(sel_ru_parse(text, &u), SEL_EFORMAT);
	CHECK(memcmp(&u, &before, sizeof u) == 0); /* untouched on failure */
	const char *m = sel_errmsg();
	CHECKF(strstr(m, part), "'%s': message '%s' lacks '%s'", text, m, part);
	CHECKF(strstr(m, "remote URL '"), "'%s': message '%s' does not quote the URL", text, m);
	CHECK(!strchr(m, '\n'));
}

int main(void)
{
	struct sel_ru_url u;
	CHECK_OK(sel_ru_parse("redis://127.0.0.1:6380/3", &u));
	CHECK(u.kind == SEL_RU_TCP && u.n == 1 && u.db == 3 && u.seed[0].port == 6380);
	CHECK(strcmp(u.seed[0].host, "127.0.0.1") == 0);
	CHECK_OK(sel_ru_parse("unix:///run/redis/redis.sock", &u));
	CHECK(u.kind == SEL_RU_UNIX && strcmp(u.path, "/run/redis/redis.sock") == 0);
	CHECK_OK(sel_ru_parse("redis-cluster://a:7000,b:7001,[::1]:7002", &u));
	CHECK(u.kind == SEL_RU_CLUSTER && u.n == 3 && u.seed[2].port == 7002);
	CHECK(strcmp(u.seed[2].host, "::1") == 0);

	ok("redis://localhost", "redis://localhost:6379");
	ok("redis://localhost:6379/0", "redis://localhost:6379");
	ok("redis://cache-1.internal_zone:7000/15", "redis://cache-1.internal_zone:7000/15");
	ok("redis://[::1]:6380", "redis://[::1]:6380");
	ok("redis://[fe80::1%eth0]/2", "redis://[fe80::1%eth0]:6379/2");
	ok("unix:///tmp/r.sock", "unix:///tmp/r.sock");
	ok("redis-cluster://10.0.0.1", "redis-cluster://10.0.0.1:6379");
	ok("redis-cluster://10.0.0.1:7000,10.0.0.2:7000",
	   "redis-cluster://10.0.0.1:7000,10.0.0.2:7000");

	bad("", "expected redis://HOST");
	bad("localhost:6379", "unknown scheme");
	bad("http://localhost", "unknown scheme");
	bad("rediss://localhost", "TLS");
	bad("redis://", "empty host");
	bad("redis://:6379", "empty host");
	bad("redis://host:0", "port '0'");
	bad("redis://host:65536", "port '65536'");
	bad("redis://host:12x", "port '12x'");
	bad("redis://host:", "port ''");
	bad("redis://host:123456", "port");
	bad("redis://ho st", "host 'ho st'");
	bad("redis://host/", "database ''");
	bad("redis://host/x", "database 'x'");
	bad("redis://host/1234567890", "database");
	bad("redis://user:pw@host", "passwords");
	bad("redis://host?timeout=1", "options");
	bad("redis://host#x", "options");
	bad("redis://[::1", "without ']'");
	bad("redis://[zz]:1", "IPv6");
	bad("redis://[1.2.3.4]:1", "IPv6");
	bad("redis://[::1]x", "unexpected");
	bad("unix://relative.sock", "absolute path");
	bad("unix://", "absolute path");
	bad("redis-cluster://", "empty host");
	bad("redis-cluster://a:1,", "empty host");
	bad("redis-cluster://a:1,,b:2", "empty host");
	bad("redis-cluster://a:1/0", "no databases");
	bad("redis://host\n", "control byte");
	char big[1200];
	int n = snprintf(big, sizeof big, "redis://");
	memset(big + n, 'a', 300);
	big[n + 300] = '\0';
	bad(big, "host of 300 bytes");
	n = snprintf(big, sizeof big, "unix:///");
	memset(big + n, 'p', 200);
	big[n + 200] = '\0';
	bad(big, "socket path");
	n = snprintf(big, sizeof big, "redis-cluster://");
	for (int i = 0; i < SEL_RU_SEEDS_MAX + 1; i++)
		n += snprintf(big + n, sizeof big - (size_t)n, "%sh%d:1", i ? "," : "", i);
	bad(big, "seed nodes");
	/* A full cluster URL prints back within SEL_RU_TEXT_MAX. */
	n = snprintf(big, sizeof big, "redis-cluster://");
	for (int i = 0; i < SEL_RU_SEEDS_MAX; i++)
		n += snprintf(big + n, sizeof big - (size_t)n, "%snode-%d.example:6379",
			      i ? "," : "", i);
	ok(big, big);
	/* A small buffer is refused, not overrun. */
	char tiny[8];
	CHECK_OK(sel_ru_parse("redis://localhost", &u));
	CHECK(sel_ru_format(&u, tiny, sizeof tiny) == -ENOBUFS);
	printf("ok\n");
	return 0;
}
