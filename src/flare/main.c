/*
 * main.c - the flare command: dispatch to its subcommands.
 *
 *   flare run [CORE] [flags]   serve the OpenAI-compatible API (serve.c)
 *   flare records CMD DIR      ls, verify, stat, gc a record directory (records.c)
 *   flare pool [flags]         the pool manager (src/manager/, docs/pool.md)
 *   flare --help | --version
 */
#include <stdio.h>
#include <string.h>

#include "flare/backend.h"
#include "flare/records.h"
#include "flare/serve.h"
#include "manager/manager.h"
#include "selene.h"

static int usage(FILE *f)
{
	fprintf(f,
		"usage: flare run [CORE] [flags]   serve a core over HTTP (flare run --help)\n"
		"       flare records CMD DIR [flags]   ls, verify, stat or gc a prefix-cache\n"
		"                                        record directory (flare records --help)\n"
		"       flare pool --socket PATH --memory SIZE [flags]   the pool manager that\n"
		"                                        instances share (flare pool --help)\n"
		"       flare --version\n"
		"       flare --help\n");
	return f == stderr ? 2 : 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return usage(stderr);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help"))
		return usage(stdout);
	if (!strcmp(argv[1], "--version")) {
		printf("flare %d.%d\n", SEL_VERSION_MAJOR, SEL_VERSION_MINOR);
		return 0;
	}
	if (!strcmp(argv[1], "run"))
		return flare_serve(argc - 1, argv + 1, &flare_engine_backend);
	if (!strcmp(argv[1], "records"))
		return flare_records(argc - 1, argv + 1, stdout, stderr);
	if (!strcmp(argv[1], "pool"))
		return mgr_pool_main(argc - 1, argv + 1);
	fprintf(stderr, "flare: unknown command '%s'\n", argv[1]);
	return usage(stderr);
}
