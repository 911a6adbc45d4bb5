/*
 * engine_load.h - a restore's pages and row loaded into the model (model.h
 * loading rule) for the engine's worker, split over helper threads when
 * the restore is large (engine_load.c).
 */
#ifndef HEL_ENGINE_LOAD_H
#define HEL_ENGINE_LOAD_H

#include <stdbool.h>
#include <stdint.h>

#include "helios/model.h"

/* Restores of at least this many bytes load on helper threads too, unless
 * hel_engine_config.load_split_bytes says otherwise. */
#define HEL_LOAD_SPLIT_BYTES (16ull << 20)

/* hel_model_page_loaded() for pages[0..n) and hel_model_row_loaded(row,
 * consumed): on the calling thread alone, or, when split and the model
 * allows it (hel_model_loads_concurrent), over up to four threads.  The
 * first failure's status, its message set on the calling thread. */
int hel_load_restored(hel_model *m, const uint32_t *pages, uint32_t n, uint32_t row,
		      uint64_t consumed, bool split);

#endif
