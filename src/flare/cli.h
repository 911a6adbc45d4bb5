/*
 * cli.h - the flags of `flare run` (docs/configuration.md).
 *
 * Pure: parsing reads argv and writes a struct, printing nothing.
 */
#ifndef FLARE_CLI_H
#define FLARE_CLI_H

#include <stddef.h>
#include <stdio.h>

#include "flare/settings.h"

#define FLARE_CLI_HELP 1

/* Parse `run [OPTIONS] [CORE]`: argv[0] is the command name and is
 * skipped.  Flags take their value as the next argument or after '='
 * (--port=0); --prefix-cache-drain-on-shutdown, which also stands alone,
 * takes the next argument only when it reads as its value (on, off or a
 * duration: `--prefix-cache-drain-on-shutdown 90s`).
 * "--" ends the flags.  out is reset (set = 0) and receives exactly what
 * the flags say.  Returns 0, FLARE_CLI_HELP when --help was given (nothing
 * else is checked then), or -EINVAL with a message naming the flag and the
 * value ("--prefix-cache-memory: '8X' is not a size: unknown unit ..."). */
int flare_cli_parse(int argc, char *const argv[], struct flare_settings *out, char *err,
		    size_t errlen);

/* The --help text: every flag with its value, default and config key. */
void flare_cli_help(FILE *f);

#endif
