/*
 * test_debug_checks.c - the safety net is armed: in a build with
 * SEL_DEBUG_CHECKS (make check-asan), a broken invariant aborts at the next
 * mutation, naming the checker, instead of going on.  Each case breaks one
 * module's state in a child process and expects SIGABRT:
 *
 *   slab     a double free (refused; sel_slab_check fails from then on);
 *   index    a node's child count overwritten, then a touch.
 *
 * (The store, transfer and scheduler checkers are proven the same way by
 * hand: their state is not reachable from outside.)
 *
 * Other builds skip: the checkers are compiled out there.
 */
#include "testutil.h"

#include "index.h"
#include "slab.h"

#ifdef SEL_DEBUG_CHECKS

static void slab_double_free(void *arg)
{
	(void)arg;
	sel_slab_pool *p;
	uint32_t s[2];
	CHECK_OK(sel_slab_create(4096, 4, 1, false, NULL, &p));
	CHECK_OK(sel_slab_alloc(p, 2, SEL_SLAB_WARM, s));
	CHECK_OK(sel_slab_free(p, s, 1));
	(void)sel_slab_free(p, s, 1); /* refused: the checker aborts here */
}

static void index_bad_children(void *arg)
{
	(void)arg;
	sel_index *ix;
	CHECK_OK(sel_index_create(64, NULL, NULL, &ix));
	test_rng r;
	test_rng_init(&r, 7);
	sel_key k;
	memset(&k, 0, sizeof k);
	test_rng_fill(&r, k.digest.b, sizeof k.digest.b);
	k.consumed = 128;
	sel_digest b = k.digest;
	sel_node_id id;
	CHECK_OK(sel_index_insert(ix, &k, NULL, &b, SEL_TAIL_AUTO, true, &id));
	sel_index_get(ix, id)->children = 3; /* it has none */
	sel_index_touch(ix, id);             /* the checker aborts here */
}

#endif

int main(void)
{
#ifndef SEL_DEBUG_CHECKS
	SKIP("built without SEL_DEBUG_CHECKS (make check-asan builds with it)");
#else
	CHECK(test_aborts(slab_double_free, NULL, "sel_slab_check"));
	printf("slab: a double free aborts\n");
	CHECK(test_aborts(index_bad_children, NULL, "index"));
	printf("index: a wrong child count aborts at the next touch\n");
	printf("test_debug_checks: ok\n");
	return 0;
#endif
}
