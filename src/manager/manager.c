/*
 * manager.c - `flare pool`: the pool manager's life (design 2.15;
 * docs/pool.md).
 *
 * DESIGN
 * Flags and the config file -> the arena and the socket -> the metrics
 * port -> the startup lines -> the event loop until SIGTERM or SIGINT ->
 * every connection closed, the socket unlinked -> "stopped".  Signals are
 * blocked before any thread exists (the metrics server's threads inherit
 * the mask) and read through the event loop's signalfd.
 *
 * Invariants:
 *   1. A failure before serving prints one line naming the flag or file and
 *      returns 2 (usage) or 1 (could not start); nothing is left behind: no
 *      socket, no thread.
 *   2. The line "flare pool: listening on unix:PATH" is printed only once
 *      the socket accepts connections.
 */
#include "manager/manager.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

int mgr_pool_main(int argc, char **argv)
{
	struct mgr_options o;
	char err[2048];
	int rc = mgr_options_parse(argc, argv, &o, err, sizeof err);
	if (rc == MGR_OPTS_HELP)
		return 0;
	if (rc) {
		fprintf(stderr, "flare pool: %s\n", err);
		return 2;
	}
	sigset_t sigs, old;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	signal(SIGPIPE, SIG_IGN);
	pthread_sigmask(SIG_BLOCK, &sigs, &old);
	struct mgr_server *srv = NULL;
	struct mgr_http *http = NULL;
	int status = 1;
	if (mgr_server_open(&o, &srv, err, sizeof err)) {
		fprintf(stderr, "flare pool: %s\n", err);
		goto out;
	}
	char line[2048];
	mgr_server_describe(srv, line, sizeof line);
	fprintf(stderr, "%s\n", line);
	if (o.metrics_port >= 0) {
		/* The generation is in the describe line; the info gauge repeats it. */
		struct mgr_metrics_info info = {.name = o.name,
						.arena_kind = o.arena[0] ? "file" : "memfd",
						.max_age_ns = o.max_age_ns};
		info.generation = mgr_server_generation(srv);
		int port = 0;
		if (mgr_http_start(o.metrics_host, o.metrics_port, &info, &http, &port, err,
				   sizeof err)) {
			fprintf(stderr, "flare pool: %s\n", err);
			goto out;
		}
		mgr_server_set_http(srv, http);
		fprintf(stderr, "flare pool: metrics on http://%s:%d/metrics\n", o.metrics_host,
			port);
	}
	fprintf(stderr, "flare pool: listening on unix:%s\n", o.socket);
	rc = mgr_server_run(srv);
	if (rc) {
		fprintf(stderr, "flare pool: the event loop failed: %s\n", strerror(-rc));
		goto out;
	}
	status = 0;
out:
	mgr_server_close(srv);
	mgr_http_stop(http);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (status == 0)
		fprintf(stderr, "flare pool: stopped\n");
	return status;
}
