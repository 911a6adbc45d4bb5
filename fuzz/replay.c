/*
 * replay.c - run a fuzz target over its stored corpus as an ordinary test.
 *
 * Linked with each fuzz/fuzz_<name>.c into build/fuzz/replay_<name>.  With no
 * arguments it replays every file in $SELENE_SRCDIR/fuzz/corpus/<name>/ (the
 * name comes from argv[0]); with arguments it replays those files.  Exits 0
 * when every input ran (a crash or sanitizer report fails the test), 77 when
 * the corpus directory is missing.
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return 1;
	}
	size_t cap = 1 << 16, n = 0;
	uint8_t *buf = malloc(cap);
	size_t r;
	while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
		n += r;
		if (n == cap) {
			uint8_t *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	fclose(f);
	if (!buf)
		return 1;
	/* An exact-size copy so ASan catches reads past the input. */
	uint8_t *exact = malloc(n ? n : 1);
	memcpy(exact, buf, n);
	free(buf);
	LLVMFuzzerTestOneInput(exact, n);
	free(exact);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		for (int i = 1; i < argc; i++)
			if (run_file(argv[i]))
				return 1;
		return 0;
	}
	const char *base = strrchr(argv[0], '/');
	base = base ? base + 1 : argv[0];
	const char *name = strncmp(base, "replay_", 7) == 0 ? base + 7 : base;
	const char *src = getenv("SELENE_SRCDIR");
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/fuzz/corpus/%s", src ? src : ".", name);
	DIR *d = opendir(dir);
	if (!d) {
		printf("skip: no corpus at %s\n", dir);
		return 77;
	}
	int files = 0, rc = 0;
	struct dirent *e;
	while ((e = readdir(d)) && !rc) {
		if (e->d_name[0] == '.')
			continue;
		char path[8192];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		rc = run_file(path);
		files++;
	}
	closedir(d);
	printf("replayed %d inputs from %s\n", files, dir);
	return rc;
}
