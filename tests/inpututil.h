/*
 * inpututil.h - what the tests of CPU inputs (design 2.13) and
 * bench/inputs share: shipped cores by name, distinct input keys, small
 * prepared records, and waiting for the preparation worker's results.
 */
#ifndef INPUTUTIL_H
#define INPUTUTIL_H

#include "helios/core.h"
#include "helios/prepare.h"
#include "input_record.h"

/* cores/<name>.core from the source tree (test_srcdir); fails the test
 * when it does not load. */
hel_core *test_core_load(const char *name);

/* A key for n, distinct for distinct n. */
sel_input_key test_input_key(uint32_t n);

/* A sealed prepared record for key test_input_key(n): one u8 tensor
 * "pixels" of `bytes` bytes, byte k = k x 13 + n. */
void test_input_prepared(sel_input_rec *r, uint32_t n, uint64_t bytes);

/* Poll w until n results are in out, sleeping on its eventfd; fails the
 * test after `seconds`. */
void test_prep_wait(hel_prep *w, hel_prep_result *out, int n, double seconds);

#endif
