/*
 * config.h - the `flare run --config FILE` file (docs/configuration.md).
 *
 * The file is a subset of TOML: `[section]` headers, `key = value` lines
 * with bare keys, values that are basic "strings" (escapes \" \\ \b \t \n
 * \f \r \uXXXX \UXXXXXXXX) or 'literal strings', decimal integers
 * (underscores between digits allowed) and booleans, and # comments.
 * Everything else TOML has (arrays, inline tables, floats, dates,
 * multi-line strings, quoted and dotted keys, [[arrays of tables]]) is
 * refused with a message saying so.  Sections: [server] and [prefix_cache];
 * the keys are those of the option table (settings.c).
 */
#ifndef FLARE_CONFIG_H
#define FLARE_CONFIG_H

#include <stddef.h>

#include "flare/settings.h"

#define FLARE_CONFIG_MAX_BYTES (1u << 20)

/* Parse text[0..len) (need not be NUL-terminated; may hold anything).
 * out is reset and receives what the file sets.  On error returns -EINVAL
 * with one line in err naming the file, the line and the key or section:
 * "flare.toml:3: prefix_cache.memory: '8X' is not a size: ...",
 * "flare.toml:7: unknown key 'memroy' in [prefix_cache]".  filename is used
 * in messages only.  Pure: no I/O. */
int flare_config_parse(const char *text, size_t len, const char *filename,
		       struct flare_settings *out, char *err, size_t errlen);

/* Read path (at most FLARE_CONFIG_MAX_BYTES) and parse it; a file that
 * cannot be read is an error naming the path. */
int flare_config_load(const char *path, struct flare_settings *out, char *err, size_t errlen);

#endif
