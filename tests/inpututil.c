/*
 * inpututil.c - shared helpers of the CPU input tests (see inpututil.h).
 */
#include "inpututil.h"

#include <poll.h>

#include "eos.h"
#include "testutil.h"

hel_core *test_core_load(const char *name)
{
	char path[4200], err[512];
	hel_core *c;
	snprintf(path, sizeof path, "%s/cores/%s.core", test_srcdir(), name);
	int rc = hel_core_load(path, &c, err, sizeof err);
	CHECKF(rc == 0, "%s", err);
	return c;
}

sel_input_key test_input_key(uint32_t n)
{
	sel_input_key k;
	sel_input_source_key("test", &n, sizeof n, "", &k);
	return k;
}

void test_input_prepared(sel_input_rec *r, uint32_t n, uint64_t bytes)
{
	sel_input_tensor t = {.dtype = SEL_DT_U8, .rank = 1, .dims = {bytes}};
	strcpy(t.name, "pixels");
	sel_input_key k = test_input_key(n);
	CHECK_OK(sel_input_prepared_init(r, &k, &t, 1));
	for (uint64_t i = 0; i < bytes; i++)
		sel_input_data(r, 0)[i] = (uint8_t)(i * 13 + n);
	CHECK_OK(sel_input_seal(r, 1));
}

void test_prep_wait(hel_prep *w, hel_prep_result *out, int n, double seconds)
{
	int got = 0;
	uint64_t deadline = eos_now_ns() + (uint64_t)(seconds * 1e9);
	while (got < n) {
		got += hel_prep_poll(w, out + got, (uint32_t)(n - got));
		if (got >= n)
			break;
		CHECKF(eos_now_ns() < deadline, "%d of %d preparation results after %.0f s", got, n,
		       seconds);
		struct pollfd p = {.fd = hel_prep_wait_fd(w), .events = POLLIN};
		poll(&p, 1, 1000);
	}
}
