/*
 * records.h - `flare records`: ls, verify, stat and gc on a prefix-cache
 * record directory without a server (design 2.5 record files, directory
 * lock, recovery scan and expiry; 2.3 leaf-first eviction;
 * docs/records-tool.md).
 */
#ifndef FLARE_RECORDS_H
#define FLARE_RECORDS_H

#include <stdio.h>

/* Run `flare records SUBCOMMAND DIR [flags]`: argv[0] is the command name
 * ("records") and is skipped.  Reports go to out (text, or one JSON
 * document with --json), one-line messages naming the directory, flag or
 * file at fault to err.  Each namespace directory is held under the
 * server's exclusive lock (eos_dirlock) while the command works on it.
 *
 * Returns the exit status: 0 done (verify: no problem found); 1 a namespace
 * could not be opened, locked or read, a removal failed, or verify found a
 * problem; 2 bad arguments (the message names the flag and the value).
 * --help prints the usage on out and returns 0. */
int flare_records(int argc, char **argv, FILE *out, FILE *err);

/* The usage text of `flare records --help`. */
void flare_records_help(FILE *f);

#endif
