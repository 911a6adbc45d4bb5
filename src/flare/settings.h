/*
 * settings.h - what `flare run` is configured with, where each setting can
 * come from, and how values are read (design 1, 2.11; docs/configuration.md).
 *
 * A setting has one entry in the option table (settings.c): its flag, its
 * config-file key, the kind of value, its default and one line of help.
 * The flag parser (cli.c), the config file parser (config.c), --help and
 * docs/configuration.md all follow that table.  Both parsers fill a struct
 * flare_settings and mark what they set in `set`; flare_settings_merge()
 * applies one over another, which is how precedence works:
 * defaults < config file < flags.
 *
 * Pure code: nothing here does I/O.
 */
#ifndef FLARE_SETTINGS_H
#define FLARE_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "helios/engine.h"
#include "selene.h"

#define FLARE_PATH_MAX 4096
#define FLARE_REMOTE_URL_MAX 4096
#define FLARE_HOST_MAX 256
#define FLARE_MAX_ACTIVE_MAX 4096u
#define FLARE_ORIGINS_MAX 2048
#define FLARE_API_KEY_MAX 256
#define FLARE_CONNECTIONS_MAX 1000000u
#define FLARE_POOL_ID_MAX 64

/* One bit per setting in flare_settings.set. */
enum flare_opt {
	FLARE_OPT_CONFIG = 0,
	FLARE_OPT_HOST,
	FLARE_OPT_PORT,
	FLARE_OPT_MAX_ACTIVE,
	FLARE_OPT_GPU_CACHE,
	FLARE_OPT_SPECULATE,
	FLARE_OPT_DRAFT_TOKENS,
	FLARE_OPT_MEMORY,
	FLARE_OPT_DISK,
	FLARE_OPT_DISK_LIMIT,
	FLARE_OPT_DRAIN,
	FLARE_OPT_MAX_AGE,
	FLARE_OPT_FETCH,
	FLARE_OPT_DASHBOARD,
	FLARE_OPT_DASHBOARD_INTERVAL,
	FLARE_OPT_ALLOWED_ORIGINS,
	FLARE_OPT_API_KEY,
	FLARE_OPT_API_KEY_FILE,
	FLARE_OPT_METRICS_AUTH,
	FLARE_OPT_MAX_CONNECTIONS,
	FLARE_OPT_MAX_PER_CLIENT,
	FLARE_OPT_IDLE_TIMEOUT,
	FLARE_OPT_MAX_BUFFERED,
	FLARE_OPT_RANKS, /* ranks in separate processes (docs/multihost.md) */
	FLARE_OPT_RANK,
	FLARE_OPT_RENDEZVOUS,
	FLARE_OPT_MAX_IMAGE_BYTES,
	FLARE_OPT_MAX_IMAGE_PIXELS,
	FLARE_OPT_MAX_IMAGES,
	FLARE_OPT_POOL,
	FLARE_OPT_POOL_INSTANCE_ID,
	FLARE_OPT_POOL_WAIT,
	FLARE_OPT_POOL_GRACE,
	FLARE_OPT_REMOTE, /* --prefix-cache-remote (issue 16) */
	FLARE_OPT_REMOTE_KEY,
	FLARE_OPT_REMOTE_ENCRYPT,
	FLARE_OPT_OVERLAP,       /* --prefix-cache-overlap (issue 18) */
	FLARE_OPT_OFFLOAD_SCHED, /* scheduling class of offload threads (issue 18) */
	FLARE_OPT_HELP,
	FLARE_OPT_CORE, /* the positional CORE argument */
	FLARE_OPT_COUNT
};
_Static_assert(FLARE_OPT_COUNT <= 64, "flare_settings.set has one bit per option");

enum flare_dashboard {
	FLARE_DASHBOARD_AUTO = 0, /* on when stderr is a terminal */
	FLARE_DASHBOARD_ON,
	FLARE_DASHBOARD_OFF,
};

struct flare_settings {
	uint64_t set;              /* bit (1ull << flare_opt) per setting given */
	char core[FLARE_PATH_MAX]; /* "" = the built-in core */
	char config[FLARE_PATH_MAX];
	char host[FLARE_HOST_MAX];
	uint16_t port; /* 0 = any free port */
	uint32_t max_active;
	uint64_t gpu_cache;        /* bytes */
	sel_state_mode speculate;  /* ORDINARY = off */
	uint32_t draft_tokens;     /* 1..HEL_DRAFT_MAX */
	uint64_t memory;           /* warm host bytes; 0 = none */
	char disk[FLARE_PATH_MAX]; /* base directory, "" = none */
	uint64_t disk_limit;       /* meaningful when FLARE_OPT_DISK_LIMIT is set */
	bool drain;                /* drain DRAM-only records to disk at shutdown */
	uint64_t drain_ns;         /* its limit; 0 = until done */
	uint64_t max_age_ns;       /* 0 = off */
	hel_fetch_mode fetch;      /* restore host hits: auto, always, never */
	enum flare_dashboard dashboard;
	uint64_t dashboard_ns;
	char allowed_origins[FLARE_ORIGINS_MAX]; /* "" off, "*", or origins joined by ',' */
	char api_key[FLARE_API_KEY_MAX + 1];     /* "" = none */
	char api_key_file[FLARE_PATH_MAX];
	bool metrics_auth; /* /metrics needs the API key too */
	uint32_t max_connections;
	uint32_t max_per_client; /* 0 = no per-client limit */
	uint64_t idle_timeout_ns;
	uint64_t max_buffered;               /* request body bytes held at once */
	uint32_t ranks;                      /* processes of a multi-host core; 0 = one */
	uint32_t rank;                       /* this process's rank */
	char rendezvous[FLARE_HOST_MAX + 8]; /* rank 0's HOST:PORT */
	/* Image parts (vision cores; docs/inputs.md): one image's encoded
	 * bytes, its pixels (from the header, before decoding), images per
	 * request. */
	uint64_t max_image_bytes, max_image_pixels;
	uint32_t max_images;
	char pool[FLARE_PATH_MAX]; /* "unix:PATH" of the pool manager, "" = none */
	char pool_instance_id[FLARE_POOL_ID_MAX + 1]; /* "" = derived */
	uint64_t pool_wait_ns;                        /* startup wait for the manager's hello */
	uint64_t pool_grace_ns;            /* shortest wait of a lookup for the pool's answer */
	char remote[FLARE_REMOTE_URL_MAX]; /* Redis URL of the remote tier, "" = none */
	char remote_key[FLARE_PATH_MAX];   /* its key file, "" = none */
	bool remote_encrypt;               /* XChaCha20-Poly1305 values */
	hel_overlap_mode overlap;          /* overlapped restores: on, off, always */
	int offload_sched;                 /* enum eos_sched_class of offload threads */
	/* Not an option: the key file's secret, read once the settings are
	 * final (flare run), wiped at exit. */
	uint8_t remote_secret[32];
};

/* The image limits the settings give (--max-image-bytes, --max-image-pixels,
 * --max-images). */
static inline hel_image_limits flare_image_limits(const struct flare_settings *s)
{
	return (hel_image_limits){.max_encoded_bytes = s->max_image_bytes,
				  .max_pixels = s->max_image_pixels,
				  .max_images = s->max_images};
}

/* How a setting's value is written. */
enum flare_kind {
	FLARE_K_NONE,     /* a flag without value (--help) */
	FLARE_K_PATH,     /* any non-empty text */
	FLARE_K_HOST,     /* an address or host name */
	FLARE_K_PORT,     /* 0..65535 */
	FLARE_K_COUNT,    /* an integer within [min, max] */
	FLARE_K_SIZE,     /* eos_parse_size */
	FLARE_K_MODE,     /* off | copy | learned */
	FLARE_K_DRAIN,    /* on | off | positive duration */
	FLARE_K_AGE,      /* off | positive duration */
	FLARE_K_FETCH,    /* auto | always | never */
	FLARE_K_SWITCH,   /* auto | on | off */
	FLARE_K_INTERVAL, /* positive duration */
	FLARE_K_ORIGINS,  /* * | origin[,origin...] */
	FLARE_K_SECRET,   /* printable text without spaces, never echoed */
	FLARE_K_BOOL,     /* on | off */
	FLARE_K_ENDPOINT, /* HOST:PORT or [V6]:PORT */
	FLARE_K_POOL,     /* unix:PATH (or a path with a '/') */
	FLARE_K_NAME,     /* 1..64 printable characters without spaces */
	FLARE_K_REMOTE,   /* a remote tier URL (sel_remote_url_check) */
	FLARE_K_ENCRYPT,  /* on | off; bare = on */
	FLARE_K_OVERLAP,  /* on | off | always */
	FLARE_K_SCHED,    /* other | batch | idle */
};

struct flare_option {
	enum flare_opt id;
	const char *flag;    /* "--port", or NULL (CORE) */
	const char *metavar; /* "N", "SIZE", ... ("" for none) */
	const char *section; /* config section, or NULL: not in the file */
	const char *key;     /* config key */
	enum flare_kind kind;
	uint64_t min, max;   /* FLARE_K_COUNT */
	bool optional_value; /* --flag alone, --flag=VALUE, or --flag VALUE when
				 VALUE reads as its value (drain) */
	const char *defval;  /* default, as --help shows it */
	const char *help;
};

/* The option table, in --help order; n receives its length. */
const struct flare_option *flare_options(size_t *n);
const struct flare_option *flare_option_by_flag(const char *flag, size_t len);
const struct flare_option *flare_option_by_key(const char *section, const char *key);
const struct flare_option *flare_option_get(enum flare_opt id);

/* The type of a value as written: a flag's text, or a config file value. */
enum flare_vtype {
	FLARE_V_TEXT,    /* from a flag: any kind parses it */
	FLARE_V_STRING,  /* config: "quoted" */
	FLARE_V_INTEGER, /* config: 123 (text holds the digits) */
	FLARE_V_BOOL,    /* config: true / false (text holds the word) */
};

/* Defaults for everything; set = 0. */
void flare_settings_defaults(struct flare_settings *s);
/* Read text (of vtype) as option o's value into s and mark it set.  On
 * error returns -EINVAL and writes a message that quotes the value and says
 * what was expected, without naming the option ("'8X' is not a size:
 * unknown unit 'X' (...)"): the caller prefixes the flag or file:line: key. */
int flare_settings_set(struct flare_settings *s, const struct flare_option *o, const char *text,
		       enum flare_vtype vtype, char *err, size_t errlen);
/* Copy every setting marked in src->set into dst (and mark it there). */
void flare_settings_merge(struct flare_settings *dst, const struct flare_settings *src);

const char *flare_mode_name(sel_state_mode m); /* "off", "copy", "learned" */

/* Make msg one printable line in place: control bytes (a newline in a
 * quoted value) become \xNN, cutting at cap like snprintf. */
void flare_message_tidy(char *msg, size_t cap);

/* The one error formatter of the flare command: the message into err (one
 * printable line, flare_message_tidy), and -EINVAL to return. */
int flare_bad(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#ifdef __clang_analyzer__
/* clang-tidy's analyzer does not see into settings.c: it returns -EINVAL. */
#include <errno.h>
#define flare_bad(err, errlen, ...) ((void)flare_bad(err, errlen, __VA_ARGS__), -EINVAL)
#endif

#endif
