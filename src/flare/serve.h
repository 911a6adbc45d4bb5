/*
 * serve.h - `flare run`: settings, the engine, the HTTP server, signals and
 * the dashboard put together (design 2.9, 2.11; docs/configuration.md).
 */
#ifndef FLARE_SERVE_H
#define FLARE_SERVE_H

#include <stddef.h>

#include "flare/backend.h"
#include "flare/buf.h"
#include "flare/settings.h"

/* Run `flare run`: argv[0] is the command name ("run").  Parses flags and
 * the config file, loads the core, opens the backend through factory,
 * prints the startup summary on stderr, serves until SIGINT or SIGTERM,
 * stops the engine and returns the exit status: 0 after a clean stop or
 * --help, 1 when the engine or the server could not start, 2 for a bad
 * flag, config file, core or combination.
 *
 * Signals: SIGINT and SIGTERM are blocked in the calling thread before any
 * thread starts (threads inherit the mask) and taken with sigtimedwait, so
 * the caller should have no other thread that leaves them unblocked.  After
 * the first, a second one terminates the process.  SIGPIPE is ignored. */
int flare_serve(int argc, char **argv, const struct flare_backend_factory *factory);

/* The disk directory decision of design 2.11: the base directory to give
 * the engine, or NULL with note saying why none ("" when none was asked
 * for).  A requested directory is created (with its parents) and probed
 * for writability with a temporary file; an explicit disk limit of 0
 * selects no disk store and creates nothing. */
const char *flare_disk_resolve(const struct flare_settings *s, char *note, size_t notelen);

/* A duration as the operator writes one: "90s", "1m30s", "2h", "250ms",
 * "1.500s". */
const char *flare_duration_text(uint64_t ns, char *buf, size_t cap);

/* One line of the shutdown drain's progress (no newline): while it runs,
 * records and bytes written, the rate, writes in flight and what is left;
 * the final line, what was saved and what was not, and why. */
void flare_drain_line(char *buf, size_t cap, const sel_drain_progress *p);

/* The startup summary lines (each ending in a newline). */
void flare_serve_summary(struct flare_buf *out, const struct flare_settings *s,
			 const hel_core *core, const hel_engine_info *info, const char *disk_note);

#endif
