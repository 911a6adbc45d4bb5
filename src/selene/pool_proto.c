/*
 * pool_proto.c - the rules both ends of the pool protocol share, outside
 * the frames themselves (pool_proto_msg.c): type, reason and source names,
 * restore deadlines, the window rule, scope and instance ids (design 2.15;
 * pool_proto.h; docs/pool.md).
 *
 * DESIGN
 * Pure code: nothing here does I/O, so the manager, the client, the tests
 * and the fuzz target all apply the same rule to the same bytes.
 *
 * INVARIANTS
 *   1. sel_pool_windows_check accepts exactly the grants pool_proto.h's
 *      window rule describes: inside [data_start, arena_bytes), slot
 *      aligned, not overlapping, pages before the row, the counts asked.
 */
#include "pool_proto.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "eos.h"
#include "internal.h"
/* ---- names ---------------------------------------------------------------- */

static const char *const type_names[] = {
	[SEL_POOL_M_HELLO] = "M_HELLO",
	[SEL_POOL_M_WELCOME] = "M_WELCOME",
	[SEL_POOL_M_ANSWER] = "M_ANSWER",
	[SEL_POOL_M_CLAIM_GRANT] = "M_CLAIM_GRANT",
	[SEL_POOL_M_CLAIM_REFUSED] = "M_CLAIM_REFUSED",
	[SEL_POOL_M_PUT_GRANT] = "M_PUT_GRANT",
	[SEL_POOL_M_PUT_REFUSED] = "M_PUT_REFUSED",
	[SEL_POOL_M_PUT_RESULT] = "M_PUT_RESULT",
	[SEL_POOL_M_EXPORT_REQUEST] = "M_EXPORT_REQUEST",
	[SEL_POOL_M_EXPORT_CANCEL] = "M_EXPORT_CANCEL",
	[SEL_POOL_M_LEASE_FAILED] = "M_LEASE_FAILED",
	[SEL_POOL_M_ERROR] = "M_ERROR",
	[SEL_POOL_C_HELLO] = "C_HELLO",
	[SEL_POOL_C_ANNOUNCE] = "C_ANNOUNCE",
	[SEL_POOL_C_WITHDRAW] = "C_WITHDRAW",
	[SEL_POOL_C_RESET] = "C_RESET",
	[SEL_POOL_C_LOOKUP] = "C_LOOKUP",
	[SEL_POOL_C_CLAIM] = "C_CLAIM",
	[SEL_POOL_C_RELEASE] = "C_RELEASE",
	[SEL_POOL_C_PROGRESS] = "C_PROGRESS",
	[SEL_POOL_C_PUT] = "C_PUT",
	[SEL_POOL_C_COMMIT] = "C_COMMIT",
	[SEL_POOL_C_EXPORT_REPLY] = "C_EXPORT_REPLY",
	[SEL_POOL_C_EXPORT_DONE] = "C_EXPORT_DONE",
};

bool sel_pool_type_known(uint16_t type)
{
	return type < sizeof type_names / sizeof type_names[0] && type_names[type];
}

const char *sel_pool_type_name(uint16_t type)
{
	return sel_pool_type_known(type) ? type_names[type] : "?";
}

static const char *const reason_names[SEL_POOL_REASONS] = {
	"ok",          "not_found",   "generation_changed",
	"chain_gap",   "no_headroom", "no_room",
	"busy",        "present",     "in_flight",
	"orphan",      "oversize",    "bad_request",
	"forged",      "stale",       "timeout",
	"no_progress", "gone",        "cancelled",
	"recovering",  "scope",       "version",
	"duplicate",   "too_many",    "corrupt",
	"copy_failed", "full",        "malformed",
	"shutdown",
};

const char *sel_pool_reason_name(uint32_t r)
{
	return r < SEL_POOL_REASONS ? reason_names[r] : "?";
}

const char *sel_pool_source_name(uint32_t s)
{
	static const char *const n[SEL_POOL_SOURCES] = {"pool", "gpu", "dram", "nvme"};
	return s < SEL_POOL_SOURCES ? n[s] : "?";
}

/* ---- shared rules ------------------------------------------------------------------ */

uint32_t sel_pool_deadline_ms(uint32_t setup_ms, uint32_t limit_ms, uint64_t bytes)
{
	uint64_t ms = setup_ms < limit_ms ? setup_ms : limit_ms;
	uint64_t whole = bytes / SEL_POOL_DEADLINE_BPS, rest = bytes % SEL_POOL_DEADLINE_BPS;
	if (whole > UINT32_MAX)
		return UINT32_MAX;
	ms += whole * 1000 + (rest * 1000 + SEL_POOL_DEADLINE_BPS - 1) / SEL_POOL_DEADLINE_BPS;
	return ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

static int cmp_off(const void *a, const void *b)
{
	const struct sel_pool_window *x = *(const struct sel_pool_window *const *)a,
				     *y = *(const struct sel_pool_window *const *)b;
	return x->off < y->off ? -1 : x->off > y->off;
}

int sel_pool_windows_check(const struct sel_pool_window *w, uint32_t n, uint64_t arena_bytes,
			   uint64_t data_start, uint64_t slot_bytes, uint32_t pages,
			   uint32_t row_slots)
{
	if (!slot_bytes || slot_bytes % EOS_ALIGN)
		return eos_fail(SEL_EFORMAT,
				"pool windows: slot bytes %" PRIu64 " are not a 4 KiB multiple",
				slot_bytes);
	uint64_t got_pages = 0, got_row = 0;
	bool in_row = false;
	for (uint32_t i = 0; i < n; i++) {
		const struct sel_pool_window *x = &w[i];
		if (!x->slots)
			return eos_fail(SEL_EFORMAT, "pool windows: window %u holds no slot", i);
		if (x->off < data_start || x->off % slot_bytes)
			return eos_fail(SEL_EFORMAT,
					"pool windows: window %u at %" PRIu64
					" is not a slot of the arena",
					i, x->off);
		if (x->slots > (arena_bytes - x->off) / slot_bytes || x->off > arena_bytes)
			return eos_fail(SEL_EFORMAT,
					"pool windows: window %u (%" PRIu64 " + %u slots) "
					"ends beyond the arena of %" PRIu64 " bytes",
					i, x->off, x->slots, arena_bytes);
		if (x->kind == SEL_POOL_WIN_PAGES) {
			if (in_row)
				return eos_fail(SEL_EFORMAT,
						"pool windows: pages window %u after the row", i);
			got_pages += x->slots;
		} else if (x->kind == SEL_POOL_WIN_ROW) {
			in_row = true;
			got_row += x->slots;
		} else {
			return eos_fail(SEL_EFORMAT, "pool windows: window %u has kind %u", i,
					x->kind);
		}
	}
	if (got_pages != pages || got_row != row_slots)
		return eos_fail(SEL_EFORMAT,
				"pool windows: %" PRIu64 " page and %" PRIu64 " row slots, "
				"expected %u and %u",
				got_pages, got_row, pages, row_slots);
	if (n < 2)
		return 0;
	const struct sel_pool_window **s =
		malloc((size_t)n * sizeof(const struct sel_pool_window *));
	if (!s)
		return eos_fail(-ENOMEM, "pool windows: out of memory");
	for (uint32_t i = 0; i < n; i++)
		s[i] = &w[i];
	qsort(s, n, sizeof(const struct sel_pool_window *), cmp_off);
	int rc = 0;
	for (uint32_t i = 1; i < n && !rc; i++)
		if (s[i - 1]->off + (uint64_t)s[i - 1]->slots * slot_bytes > s[i]->off)
			rc = eos_fail(SEL_EFORMAT,
				      "pool windows: windows at %" PRIu64 " and %" PRIu64
				      " overlap",
				      s[i - 1]->off, s[i]->off);
	free(s);
	return rc;
}

static void h_u64(crypto_generichash_blake2b_state *st, uint64_t v)
{
	uint8_t b[8];
	sel_put_u64(b, v);
	crypto_generichash_blake2b_update(st, b, 8);
}
static void h_str(crypto_generichash_blake2b_state *st, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	h_u64(st, n);
	if (n)
		crypto_generichash_blake2b_update(st, (const unsigned char *)s, n);
}

void sel_pool_scope_id(const char *pool_name, const struct sel_pool_scope *s,
		       uint8_t out[SEL_POOL_ID_BYTES])
{
	static const char dom[] = "flare-pool-scope-v1";
	crypto_generichash_blake2b_state st;
	sel_crypto_init();
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_POOL_ID_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)dom, sizeof dom - 1);
	h_str(&st, pool_name);
	crypto_generichash_blake2b_update(&st, s->identity, SEL_IDENTITY_BYTES);
	crypto_generichash_blake2b_update(&st, s->fingerprint, SEL_FINGERPRINT_BYTES);
	h_u64(&st, s->page_tokens);
	h_u64(&st, s->ranks);
	h_u64(&st, s->slot_bytes);
	h_u64(&st, s->row_slots);
	h_u64(&st, s->table_bytes);
	if (s->table_bytes)
		crypto_generichash_blake2b_update(&st, s->table, s->table_bytes);
	crypto_generichash_blake2b_final(&st, out, SEL_POOL_ID_BYTES);
}

void sel_pool_instance_id(const char *pool_name, const char *explicit_id, const char *machine_id,
			  const uint8_t core_identity[SEL_IDENTITY_BYTES], const char *listen,
			  uint8_t out[SEL_POOL_ID_BYTES])
{
	static const char dom[] = "flare-pool-instance-v1";
	static const uint8_t zero[SEL_IDENTITY_BYTES];
	crypto_generichash_blake2b_state st;
	sel_crypto_init();
	crypto_generichash_blake2b_init(&st, NULL, 0, SEL_POOL_ID_BYTES);
	crypto_generichash_blake2b_update(&st, (const unsigned char *)dom, sizeof dom - 1);
	h_str(&st, pool_name);
	if (explicit_id && *explicit_id) {
		uint8_t tag = 1;
		crypto_generichash_blake2b_update(&st, &tag, 1);
		h_str(&st, explicit_id);
	} else {
		uint8_t tag = 2;
		crypto_generichash_blake2b_update(&st, &tag, 1);
		h_str(&st, machine_id);
		crypto_generichash_blake2b_update(&st, core_identity ? core_identity : zero,
						  SEL_IDENTITY_BYTES);
		h_str(&st, listen);
	}
	crypto_generichash_blake2b_final(&st, out, SEL_POOL_ID_BYTES);
}
