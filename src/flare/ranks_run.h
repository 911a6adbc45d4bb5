/*
 * ranks_run.h - `flare run CORE --ranks N --rank R --rendezvous HOST:PORT`:
 * a multi-host core as one process per rank (src/helios/ranks.h;
 * docs/multihost.md "Execution").
 */
#ifndef FLARE_RANKS_RUN_H
#define FLARE_RANKS_RUN_H

#include "flare/settings.h"
#include "helios/core.h"
#include "helios/ranks.h"

/* Whether these settings run ranks in separate processes (--ranks > 1). */
bool flare_ranks_on(const struct flare_settings *s);
/* The rank settings against the core and the rest: 0, or -1 with one line
 * printed naming the flag and why. */
int flare_ranks_check(const struct flare_settings *s, const hel_core *core);
/* A peer (--rank > 0): join rank 0, compute until it stops.  The exit
 * status: 0 after rank 0 closed the instance, 1 with the reason printed. */
int flare_ranks_peer(const struct flare_settings *s, const hel_core *core);
/* Rank 0: listen on the rendezvous address (printing it) and wait for
 * every peer.  When the group stops later (a peer died), SIGUSR1 is
 * raised for the main thread's signal wait.  0, or -1 with the message
 * printed. */
int flare_ranks_lead(const struct flare_settings *s, const hel_core *core, hel_ranks **out);

#endif
