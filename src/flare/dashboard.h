/*
 * dashboard.h - the one-line status `flare run` prints on stderr every
 * interval (design 3.1 step 11: "one dashboard line").
 *
 * Pure: two snapshots and the time between them in, one line out.
 */
#ifndef FLARE_DASHBOARD_H
#define FLARE_DASHBOARD_H

#include <stddef.h>
#include <stdint.h>

#include "helios/engine.h"

/* Format the line (no newline) into buf.  prev is the previous snapshot
 * (NULL on the first line: rates then cover cur's whole uptime); ns is the
 * time between the two (ignored without prev).  Returns buf. */
const char *flare_dashboard_line(char *buf, size_t cap, const hel_engine_stats *prev,
				 const hel_engine_stats *cur, uint64_t ns);

#endif
