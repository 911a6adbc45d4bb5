/*
 * model.c - the synthetic model of the reference engine (ARCHITECTURE.md
 * "The reference engine's model"; design 2.1 "Checkpoint bytes").
 *
 * There is no trained model on these machines, and the store must be judged
 * on real bytes, so Helios runs a small integer transformer whose weights
 * come from the core's seed and whose cache has exactly the core's layout.
 * What it computes is meaningless; how it depends on its cache is the point:
 * every byte a checkpoint holds feeds the next token, so a wrong, stale or
 * misplaced byte changes the output, and the same prompt gives bit-identical
 * logits however its prefix was computed or restored.
 *
 * DESIGN
 *   One per-token kernel (step) serves prefill and decode, so chunking
 *   cannot change anything.  For token x at position n of a sequence:
 *     1. context: c64 mixes n, each rank's recurrent summary S and partial
 *        page summary P; hs sums each rank's copy of the last hidden vector
 *        with odd rank weights (a tensor-parallel all-reduce);
 *     2. z = nl(emb[x] + rot(hs) + lanes(c64));
 *     3. `layers` attention blocks over the page table: a query from z, a
 *        score and a non-linear weight per page from its summary key and
 *        its position in the table, a weighted sum of summary values,
 *        projected back and mixed into z;
 *     4. recurrent update of each rank's state in the row (hybrid models):
 *        word 0 holds the previous token, then an induction table
 *        (previous token -> the token that followed it, which biases the
 *        logits the way induction heads do and gives copy drafts something
 *        to find), then mixing words, a few of which change per token;
 *        the updated summary is mixed into z, which is the new hidden;
 *     5. the token's bytes of every plane on every rank (derived from z,
 *        with a rank salt on split planes only) go to the partial page in
 *        the row; when the page completes they are copied to next_page in
 *        every plane of every rank and the page's summary is set;
 *     6. speculative modes update the draft state the same way from the
 *        draft hidden: draft history ring, draft hidden, draft planes;
 *     7. logits = Wout z (integer, wrapping), masked to printable ASCII,
 *        newline and END, plus the induction bonus.
 *   Summaries keep the cost per token at O(pages x lanes x layers + row
 *   context + the token's plane bytes) instead of O(context bytes): a page
 *   summary is a function of every byte of the page on every plane and rank
 *   (sum of XXH3 of each token's chunk of each plane, rank-salted); a row's
 *   recurrent summary is sum_i mix(word_i, i) over every state word, its
 *   partial summary the same XXH3 sum over its partial page.  They are
 *   maintained incrementally by the kernel and recomputed from the bytes by
 *   hel_model_page_loaded() and hel_model_row_loaded() after a restore.
 *   The hidden vectors, consumed counts and draft history are read whole
 *   every token.  All arithmetic is on unsigned integers modulo 2^32 or
 *   2^64 with bijective mixers, so one flipped bit changes a summary with
 *   certainty and the logits with overwhelming probability; there are no
 *   floating-point values anywhere in the model (sampling at a temperature
 *   uses doubles in a fixed order, outside the kernel).
 *   hel_model_logits re-derives step 7 from the row alone (its hidden
 *   vector and its previous-token word), so a request restored at the end
 *   of its prompt samples exactly what the step that ended there did.
 *   Draft state never feeds the main logits: it feeds the proposals, which
 *   verification accepts only where they equal the model's own choice, so
 *   speculative modes emit exactly the ordinary tokens while their extra
 *   bytes (and state mode) give them a separate storage namespace.
 *
 * INVARIANTS
 *   1. For every loaded page id, ps[id] is the summary of its current bytes
 *      (hel_model_check verifies).
 *   2. For every valid slot and rank, rs.S, rs.P and rs.DP are the summaries
 *      of the row's current bytes, all ranks hold the same consumed count,
 *      and the partial pages hold zeros past consumed % page_tokens tokens.
 *   3. Replicated planes and row regions (hidden, consumed, draft regions,
 *      replicated recurrent state) hold identical bytes on every rank.
 *   4. Every output is a function of the core, the mode and the bytes of
 *      the row and the pages in the table: not of slot or page ids, chunking,
 *      or anything else.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <xxhash.h>

#include "eos.h"
#include "model.h"
#include "vision.h"

#define GOLD 0x9E3779B97F4A7C15ull
#define GOLD32 0x9E3779B9u
#define SW HEL_SUMMARY_LANES
#define REC_UPDATES 16   /* mixing words updated per token per rank */
#define INDUCTION_BONUS 6144
#define DRAFT_BONUS 16384 /* the draft head trusts its history outright */
#define NO_TOKEN UINT32_MAX

/* Salt tags: each use of the seed gets its own (tag, index) pair. */
enum {
	T_EMB = 1, T_WQ, T_WO, T_WOUT, T_H0, T_DEMB, T_DWQ, T_DWO, T_DOUT, T_D0,
	T_POS, T_DPOS, T_SPLIT, T_REP, T_COMB, T_IND, T_TAG, T_PLANE, T_KLANE, T_VLANE,
	T_VISION, /* vision cores only: text cores use none of it */
};
/* Per-rank salts combining that rank's summaries into the model's inputs. */
enum { C_S, C_P, C_HISTORY, C_DP, C_PAGE, C_DPAGE, C_REC, COMB_SALTS };

static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 32;
	x *= 0xd6e8feb86659fd93ull;
	x ^= x >> 32;
	x *= 0xd6e8feb86659fd93ull;
	x ^= x >> 32;
	return x;
}

static inline uint32_t nl32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

static inline uint32_t rotl32(uint32_t x, unsigned r)
{
	return x << r | x >> (32 - r);
}

/* n (even) pseudo-random lanes from c. */
static void lanes(uint64_t c, uint32_t *out, uint32_t n)
{
	for (uint32_t j = 0; j < n; j += 2) {
		uint64_t v = mix64(c + (j + 1) * GOLD);
		out[j] = (uint32_t)v;
		out[j + 1] = (uint32_t)(v >> 32);
	}
}

static inline uint64_t rd64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static inline void wr64(uint8_t *p, uint64_t v)
{
	memcpy(p, &v, 8);
}

/* ---- The model ----------------------------------------------------------- */

struct mplane {
	const hel_core_plane *cp;
	uint64_t tb, unit; /* bytes per token, per page */
	uint64_t part;     /* offset of its partial page in the row */
	uint64_t key;      /* salt, from the name */
	bool draft;
};

struct page_sum {
	uint32_t k[SW], v[SW];   /* main planes */
	uint32_t dk[SW], dv[SW]; /* draft planes (speculative) */
	uint64_t digest, ddigest;
	bool valid;
};

struct row_sum {
	uint64_t S;  /* recurrent state */
	uint64_t P;  /* partial page, main planes */
	uint64_t DP; /* partial page, draft planes */
};

struct ptab {
	const uint32_t *ids;
	uint32_t n;
	uint32_t extra; /* one more id after ids[n-1], or HEL_NO_PAGE */
};

static inline uint32_t ptab_len(const struct ptab *t)
{
	return t->n + (t->extra != HEL_NO_PAGE);
}

static inline uint32_t ptab_at(const struct ptab *t, uint32_t i)
{
	return i < t->n ? t->ids[i] : t->extra;
}

struct hel_model {
	const hel_core *core;
	sel_state_mode mode;
	bool spec;
	uint32_t R, H, L, V, pt, Hd, K;
	uint32_t pages, rows;
	hel_row_layout lay;
	struct mplane *pl; /* [npl]: main planes, then drafts */
	uint32_t npl, nmain;
	uint8_t **pbase;   /* [R * npl] */
	uint8_t **rbase;   /* [R] */
	size_t *pmap;      /* [npl] mapping length per plane */
	size_t rmap;       /* per rank */
	struct page_sum *ps; /* [pages] */
	struct row_sum *rs;  /* [rows * R] */
	bool *row_valid;     /* [rows] */
	uint64_t *zero_hash; /* [npl * pt] */
	uint64_t P_empty, DP_empty;
	uint64_t *S_zero;    /* [R] */
	uint64_t *split_salt; /* [R] */
	uint64_t rep_salt;
	uint64_t *comb;      /* [R * COMB_SALTS] */
	uint64_t pos_salt, dpos_salt, ind_salt, tag_salt;
	uint64_t vis_salt; /* vision cores: the image-token state salt */
	/* recurrent geometry, in words */
	uint64_t W, T, M;
	/* weights */
	uint32_t *emb, *wq, *wo, *wout, *h0;
	uint32_t *demb, *dwq, *dwo, *dout, *d0;
	uint8_t *gen; /* [V]: 1 if the model may generate the token */
	/* scratch (one thread) */
	uint32_t *z, *hs, *lane, *att, *d, *dhs;
	uint32_t q[SW], acc[SW];
	int32_t *logits;
};

static inline uint8_t *rowp(const hel_model *m, uint32_t r, uint32_t slot)
{
	return m->rbase[r] + (uint64_t)slot * m->lay.bytes;
}

static inline uint8_t *pagep(const hel_model *m, uint32_t r, uint32_t p, uint32_t id)
{
	return m->pbase[(size_t)r * m->npl + p] + (uint64_t)id * m->pl[p].unit;
}

static inline uint64_t comb(const hel_model *m, uint32_t r, int k)
{
	return m->comb[(size_t)r * COMB_SALTS + (size_t)k];
}

static inline uint64_t shard_salt(const hel_model *m, hel_shard s, uint32_t r)
{
	return s == HEL_SHARD_SPLIT ? m->split_salt[r] : m->rep_salt;
}

static inline uint64_t seed_salt(const hel_core *c, uint64_t tag, uint64_t index)
{
	return mix64(c->seed ^ mix64(tag * GOLD + index)); /* index < 2^32: no collisions */
}

static void gen_weights(uint32_t *w, size_t n, uint64_t salt)
{
	for (size_t i = 0; i < n; i += 2) {
		uint64_t v = mix64(salt + (i + 1) * GOLD);
		w[i] = (uint32_t)v;
		if (i + 1 < n)
			w[i + 1] = (uint32_t)(v >> 32);
	}
}

/* ---- Summaries ------------------------------------------------------------ */

/* Recurrent-state term of word i: bijective in w, so any change counts. */
static inline uint64_t rec_term(uint64_t rsr, uint64_t i, uint64_t w)
{
	return mix64((w ^ rsr) + i * GOLD);
}

static uint64_t rec_sum(const hel_model *m, const uint8_t *row, uint64_t rsr)
{
	const uint8_t *w = row + m->lay.recurrent;
	uint64_t s = 0;
	for (uint64_t i = 0; i < m->W; i++)
		s += rec_term(rsr, i, rd64(w + 8 * i));
	return s;
}

/* One plane's page (or partial page, laid out the same): the sum of the
 * XXH3 of each token's chunk, seeded by the plane and the position. */
static uint64_t unit_sum(const hel_model *m, const struct mplane *p, const uint8_t *unit)
{
	uint64_t s = 0;
	for (uint32_t t = 0; t < m->pt; t++)
		s += XXH3_64bits_withSeed(unit + t * p->tb, p->tb, p->key + t);
	return s;
}

static uint64_t partial_sum(const hel_model *m, const uint8_t *row, bool draft)
{
	uint64_t s = 0;
	for (uint32_t p = 0; p < m->npl; p++)
		if (m->pl[p].draft == draft)
			s += unit_sum(m, &m->pl[p], row + m->pl[p].part);
	return s;
}

/* Digest of page id from every rank's planes of one group. */
static uint64_t page_digest(const hel_model *m, uint32_t id, bool draft)
{
	uint64_t d = 0;
	for (uint32_t r = 0; r < m->R; r++) {
		uint64_t s = 0;
		for (uint32_t p = 0; p < m->npl; p++)
			if (m->pl[p].draft == draft)
				s += unit_sum(m, &m->pl[p], pagep(m, r, p, id));
		d += mix64(s + comb(m, r, draft ? C_DPAGE : C_PAGE));
	}
	return d;
}

static void set_page_sum(const hel_model *m, struct page_sum *ps, uint64_t digest, bool draft)
{
	uint64_t kt = seed_salt(m->core, T_KLANE, 0), vt = seed_salt(m->core, T_VLANE, 0);
	if (draft) {
		ps->ddigest = digest;
		lanes(digest ^ kt, ps->dk, SW);
		lanes(digest ^ vt, ps->dv, SW);
	} else {
		ps->digest = digest;
		lanes(digest ^ kt, ps->k, SW);
		lanes(digest ^ vt, ps->v, SW);
	}
}

/* ---- Creation -------------------------------------------------------------- */

/* Plane and row memory stands in for GPU memory, which an engine allocates
 * up front: pre-faulted (MAP_POPULATE) so that neither a decode step nor a
 * restore's copy-in pays first-touch page faults (on this 2-core VM they
 * made a 100K restore 4.9 s instead of 0.7 s and the decode p99 4.6 ms
 * instead of 0.5 ms). */
static void *map(size_t len)
{
	void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	return p == MAP_FAILED ? NULL : p;
}

int hel_model_create(const hel_core *c, const hel_model_opts *o, hel_model **out)
{
	hel_model *m = NULL;
	int rc = -ENOMEM;

	*out = NULL;
	if (!hel_core_supports(c, o->mode))
		return eos_fail(-EINVAL, "model: core '%s' does not support the %s state mode", c->name,
				sel_state_mode_name(o->mode));
	if (o->pages == 0 || o->rows == 0 || o->pages == HEL_NO_PAGE)
		return eos_fail(-EINVAL, "model: %u pages and %u rows (expected at least one of each)",
				o->pages, o->rows);
	if (o->draft_tokens > HEL_DRAFT_MAX)
		return eos_fail(-EINVAL, "model: %u draft tokens (at most %u)", o->draft_tokens,
				HEL_DRAFT_MAX);
	if (!(m = calloc(1, sizeof *m)))
		goto nomem;
	m->core = c;
	m->mode = o->mode;
	m->spec = o->mode != SEL_MODE_ORDINARY;
	m->R = c->ranks;
	m->H = c->hidden;
	m->L = c->layers;
	m->V = c->vocab;
	m->pt = c->page_tokens;
	m->Hd = m->spec ? c->draft_history : 0;
	m->K = m->spec ? (o->draft_tokens ? o->draft_tokens : HEL_DRAFT_DEFAULT) : 0;
	m->pages = o->pages;
	m->rows = o->rows;
	if ((rc = hel_core_row_layout(c, o->mode, &m->lay)))
		goto fail;
	rc = -ENOMEM;
	m->W = m->lay.recurrent_bytes / 8;
	m->T = m->W > 1 ? (m->W - 1) / 2 : 0;
	m->M = m->W > 1 ? m->W - 1 - m->T : 0;

	/* Planes: main then drafts, each in name order (the core's order). */
	m->nmain = c->n_planes;
	m->npl = c->n_planes + (m->spec ? c->n_drafts : 0);
	if (!(m->pl = calloc(m->npl, sizeof *m->pl)))
		goto nomem;
	uint64_t part = m->lay.partial, dpart = m->lay.draft_partial, maxtb = 0;
	for (uint32_t p = 0; p < m->npl; p++) {
		struct mplane *pl = &m->pl[p];
		pl->cp = p < c->n_planes ? &c->planes[p] : &c->drafts[p - c->n_planes];
		pl->draft = p >= c->n_planes;
		pl->tb = pl->cp->token_bytes;
		pl->unit = pl->tb * m->pt;
		uint64_t *off = pl->draft ? &dpart : &part;
		pl->part = *off;
		*off += pl->unit;
		pl->key = mix64(XXH3_64bits(pl->cp->name, strlen(pl->cp->name)) ^
				seed_salt(c, T_PLANE, pl->draft));
		if (pl->tb > maxtb)
			maxtb = pl->tb;
	}

	/* Salts. */
	m->split_salt = calloc(m->R, sizeof *m->split_salt);
	m->comb = calloc((size_t)m->R * COMB_SALTS, sizeof *m->comb);
	m->S_zero = calloc(m->R, sizeof *m->S_zero);
	if (!m->split_salt || !m->comb || !m->S_zero)
		goto nomem;
	m->rep_salt = seed_salt(c, T_REP, 0);
	for (uint32_t r = 0; r < m->R; r++) {
		m->split_salt[r] = seed_salt(c, T_SPLIT, r);
		for (int k = 0; k < COMB_SALTS; k++)
			m->comb[r * COMB_SALTS + k] = seed_salt(c, T_COMB, (uint64_t)r * COMB_SALTS + k);
	}
	m->pos_salt = seed_salt(c, T_POS, 0);
	m->dpos_salt = seed_salt(c, T_DPOS, o->mode); /* copy and learned bytes differ */
	m->ind_salt = seed_salt(c, T_IND, 0);
	m->tag_salt = seed_salt(c, T_TAG, 0);
	if (c->has_image)
		m->vis_salt = seed_salt(c, T_VISION, 0);

	/* Weights. */
	size_t VH = (size_t)m->V * m->H, H = m->H;
	m->emb = malloc(VH * 4);
	m->wq = malloc((size_t)m->L * SW * H * 4);
	m->wo = malloc((size_t)m->L * SW * H * 4);
	m->wout = malloc(VH * 4);
	m->h0 = malloc(H * 4);
	m->gen = calloc(m->V, 1);
	m->z = malloc(H * 4);
	m->hs = malloc(H * 4);
	m->lane = malloc(H * 4);
	m->att = malloc(H * 4);
	m->d = malloc(H * 4);
	m->dhs = malloc(H * 4);
	m->logits = malloc((size_t)m->V * 4);
	if (!m->emb || !m->wq || !m->wo || !m->wout || !m->h0 || !m->gen || !m->z || !m->hs ||
	    !m->lane || !m->att || !m->d || !m->dhs || !m->logits)
		goto nomem;
	gen_weights(m->emb, VH, seed_salt(c, T_EMB, 0));
	gen_weights(m->wq, (size_t)m->L * SW * H, seed_salt(c, T_WQ, 0));
	gen_weights(m->wo, (size_t)m->L * SW * H, seed_salt(c, T_WO, 0));
	gen_weights(m->wout, VH, seed_salt(c, T_WOUT, 0));
	gen_weights(m->h0, H, seed_salt(c, T_H0, 0));
	for (uint32_t v = 0; v < m->V; v++)
		m->gen[v] = v == '\n' || (v >= 0x20 && v <= 0x7e) || v == HEL_TOK_END;
	if (m->spec) {
		m->demb = malloc(VH * 4);
		m->dwq = malloc(SW * H * 4);
		m->dwo = malloc(SW * H * 4);
		m->dout = malloc(VH * 4);
		m->d0 = malloc(H * 4);
		if (!m->demb || !m->dwq || !m->dwo || !m->dout || !m->d0)
			goto nomem;
		gen_weights(m->demb, VH, seed_salt(c, T_DEMB, 0));
		gen_weights(m->dwq, SW * H, seed_salt(c, T_DWQ, 0));
		gen_weights(m->dwo, SW * H, seed_salt(c, T_DWO, 0));
		gen_weights(m->dout, VH, seed_salt(c, T_DOUT, 0));
		gen_weights(m->d0, H, seed_salt(c, T_D0, 0));
	}

	/* Zero-chunk hashes, empty partial sums, zero recurrent sums. */
	uint8_t *zeros = calloc(1, maxtb);
	m->zero_hash = malloc((size_t)m->npl * m->pt * sizeof *m->zero_hash);
	if (!zeros || !m->zero_hash) {
		free(zeros);
		goto nomem;
	}
	for (uint32_t p = 0; p < m->npl; p++)
		for (uint32_t t = 0; t < m->pt; t++) {
			uint64_t h = XXH3_64bits_withSeed(zeros, m->pl[p].tb, m->pl[p].key + t);
			m->zero_hash[(size_t)p * m->pt + t] = h;
			if (m->pl[p].draft)
				m->DP_empty += h;
			else
				m->P_empty += h;
		}
	free(zeros);
	for (uint32_t r = 0; r < m->R; r++) {
		uint64_t rsr = shard_salt(m, c->recurrent_shard, r);
		if (r > 0 && c->recurrent_shard == HEL_SHARD_REPLICATED) {
			m->S_zero[r] = m->S_zero[0];
			continue;
		}
		for (uint64_t i = 0; i < m->W; i++)
			m->S_zero[r] += rec_term(rsr, i, 0);
	}

	/* The planes. */
	m->pbase = calloc((size_t)m->R * m->npl, sizeof *m->pbase);
	m->pmap = calloc(m->npl, sizeof *m->pmap);
	m->rbase = calloc(m->R, sizeof *m->rbase);
	m->ps = calloc(m->pages, sizeof *m->ps);
	m->rs = calloc((size_t)m->rows * m->R, sizeof *m->rs);
	m->row_valid = calloc(m->rows, sizeof *m->row_valid);
	if (!m->pbase || !m->pmap || !m->rbase || !m->ps || !m->rs || !m->row_valid)
		goto nomem;
	for (uint32_t p = 0; p < m->npl; p++)
		m->pmap[p] = (size_t)(m->pl[p].unit * m->pages);
	m->rmap = (size_t)(m->lay.bytes * m->rows);
	for (uint32_t r = 0; r < m->R; r++) {
		for (uint32_t p = 0; p < m->npl; p++) {
			if (!(m->pbase[(size_t)r * m->npl + p] = map(m->pmap[p]))) {
				rc = eos_fail(-ENOMEM, "model: cannot map %zu bytes for plane '%s' of rank %u",
					      m->pmap[p], m->pl[p].cp->name, r);
				goto fail;
			}
		}
		if (!(m->rbase[r] = map(m->rmap))) {
			rc = eos_fail(-ENOMEM, "model: cannot map %zu bytes for the rows of rank %u",
				      m->rmap, r);
			goto fail;
		}
	}
	*out = m;
	return 0;
nomem:
	rc = eos_fail(-ENOMEM, "model: out of memory");
fail:
	hel_model_destroy(m);
	return rc;
}

void hel_model_destroy(hel_model *m)
{
	if (!m)
		return;
	if (m->pbase && m->pmap)
		for (uint32_t r = 0; r < m->R; r++)
			for (uint32_t p = 0; p < m->npl; p++)
				if (m->pbase[(size_t)r * m->npl + p])
					munmap(m->pbase[(size_t)r * m->npl + p], m->pmap[p] ? m->pmap[p] : 1);
	if (m->rbase)
		for (uint32_t r = 0; r < m->R; r++)
			if (m->rbase[r])
				munmap(m->rbase[r], m->rmap ? m->rmap : 1);
	free(m->pbase);
	free(m->pmap);
	free(m->rbase);
	free(m->ps);
	free(m->rs);
	free(m->row_valid);
	free(m->zero_hash);
	free(m->S_zero);
	free(m->split_salt);
	free(m->comb);
	free(m->pl);
	free(m->emb);
	free(m->wq);
	free(m->wo);
	free(m->wout);
	free(m->h0);
	free(m->demb);
	free(m->dwq);
	free(m->dwo);
	free(m->dout);
	free(m->d0);
	free(m->gen);
	free(m->z);
	free(m->hs);
	free(m->lane);
	free(m->att);
	free(m->d);
	free(m->dhs);
	free(m->logits);
	free(m);
}

/* ---- Accessors --------------------------------------------------------------- */

const hel_core *hel_model_core(const hel_model *m) { return m->core; }
sel_state_mode hel_model_mode(const hel_model *m) { return m->mode; }
const hel_row_layout *hel_model_layout(const hel_model *m) { return &m->lay; }
uint32_t hel_model_page_count(const hel_model *m) { return m->pages; }
uint32_t hel_model_row_count(const hel_model *m) { return m->rows; }
uint32_t hel_model_plane_count(const hel_model *m) { return m->npl; }

const hel_core_plane *hel_model_plane(const hel_model *m, uint32_t plane)
{
	return plane < m->npl ? m->pl[plane].cp : NULL;
}

uint8_t *hel_model_page_ptr(hel_model *m, uint32_t rank, uint32_t plane, uint32_t page)
{
	if (rank >= m->R || plane >= m->npl || page >= m->pages)
		return NULL;
	return pagep(m, rank, plane, page);
}

uint8_t *hel_model_row_ptr(hel_model *m, uint32_t rank, uint32_t slot)
{
	if (rank >= m->R || slot >= m->rows)
		return NULL;
	return rowp(m, rank, slot);
}

size_t hel_model_allocations(const hel_model *m, sel_allocation *out, size_t cap)
{
	size_t n = 0;
	for (uint32_t r = 0; r < m->R; r++) {
		for (uint32_t p = 0; p <= m->npl; p++, n++) {
			if (n >= cap)
				continue;
			sel_allocation *a = &out[n];
			a->rank = r;
			a->kind = SEL_MEM_HOST;
			if (p < m->npl) {
				a->name = m->pl[p].cp->name;
				a->group = SEL_GROUP_KV_PAGES;
				a->address = (uint64_t)(uintptr_t)m->pbase[(size_t)r * m->npl + p];
				a->unit_bytes = m->pl[p].unit;
				a->count = m->pages;
			} else {
				a->name = "row";
				a->group = SEL_GROUP_STATE_ROWS;
				a->address = (uint64_t)(uintptr_t)m->rbase[r];
				a->unit_bytes = m->lay.bytes;
				a->count = m->rows;
			}
		}
	}
	return n;
}

int hel_model_geometry(const hel_model *m, sel_geometry **out)
{
	size_t n = hel_model_allocations(m, NULL, 0);
	sel_allocation *a = calloc(n, sizeof *a);
	if (!a)
		return eos_fail(-ENOMEM, "model: out of memory");
	hel_model_allocations(m, a, n);
	int rc = sel_geometry_build(a, n, m->R, m->pt, out);
	free(a);
	return rc;
}

void hel_model_offload_identity(const hel_model *m, uint8_t out[SEL_IDENTITY_BYTES])
{
	sel_offload_identity(m->core->identity, m->mode, out);
}

/* ---- Rows and pages ---------------------------------------------------------- */

static inline struct row_sum *rsum(const hel_model *m, uint32_t slot, uint32_t r)
{
	return &m->rs[(size_t)slot * m->R + r];
}

int hel_model_row_init(hel_model *m, uint32_t slot)
{
	if (slot >= m->rows)
		return eos_fail(-EINVAL, "model: row slot %u of %u", slot, m->rows);
	for (uint32_t r = 0; r < m->R; r++) {
		uint8_t *row = rowp(m, r, slot);
		memset(row, 0, m->lay.bytes);
		memcpy(row + m->lay.hidden, m->h0, m->lay.hidden_bytes);
		if (m->spec)
			memcpy(row + m->lay.draft_hidden, m->d0, m->lay.draft_hidden_bytes);
		struct row_sum *s = rsum(m, slot, r);
		s->S = m->S_zero[r];
		s->P = m->P_empty;
		s->DP = m->DP_empty;
	}
	m->row_valid[slot] = true;
	return 0;
}

int hel_model_row_copy(hel_model *m, uint32_t src, uint32_t dst)
{
	if (src >= m->rows || dst >= m->rows)
		return eos_fail(-EINVAL, "model: row copy %u -> %u of %u slots", src, dst, m->rows);
	if (!m->row_valid[src])
		return eos_fail(-EINVAL, "model: row slot %u holds no sequence", src);
	if (src == dst)
		return 0;
	for (uint32_t r = 0; r < m->R; r++) {
		memcpy(rowp(m, r, dst), rowp(m, r, src), m->lay.bytes);
		*rsum(m, dst, r) = *rsum(m, src, r);
	}
	m->row_valid[dst] = true;
	return 0;
}

static int consumed_of(const hel_model *m, uint32_t slot, uint64_t *out)
{
	uint64_t n = rd64(rowp(m, 0, slot) + m->lay.consumed);
	for (uint32_t r = 1; r < m->R; r++) {
		uint64_t nr = rd64(rowp(m, r, slot) + m->lay.consumed);
		if (nr != n)
			return eos_fail(SEL_ECORRUPT,
					"model: row slot %u: rank %u consumed %llu tokens, rank 0 %llu",
					slot, r, (unsigned long long)nr, (unsigned long long)n);
	}
	*out = n;
	return 0;
}

int hel_model_row_consumed(const hel_model *m, uint32_t slot, uint64_t *out)
{
	if (slot >= m->rows || !m->row_valid[slot])
		return eos_fail(-EINVAL, "model: row slot %u holds no sequence", slot);
	return consumed_of(m, slot, out);
}

/* Bytes of every partial page past `tokens` tokens are zero. */
static int check_partial_zero(const hel_model *m, uint32_t slot, uint32_t r, uint64_t tokens)
{
	const uint8_t *row = rowp(m, r, slot);
	for (uint32_t p = 0; p < m->npl; p++) {
		const uint8_t *u = row + m->pl[p].part;
		for (uint64_t b = tokens * m->pl[p].tb; b < m->pl[p].unit; b++)
			if (u[b])
				return eos_fail(SEL_ECORRUPT,
						"model: row slot %u rank %u: partial page of plane '%s' "
						"has a non-zero byte at token %llu (holds %llu tokens)",
						slot, r, m->pl[p].cp->name,
						(unsigned long long)(b / m->pl[p].tb),
						(unsigned long long)tokens);
	}
	return 0;
}

int hel_model_row_loaded(hel_model *m, uint32_t slot, uint64_t expected)
{
	int rc;
	if (slot >= m->rows)
		return eos_fail(-EINVAL, "model: row slot %u of %u", slot, m->rows);
	m->row_valid[slot] = false;
	for (uint32_t r = 0; r < m->R; r++) {
		uint64_t n = rd64(rowp(m, r, slot) + m->lay.consumed);
		if (n != expected)
			return eos_fail(SEL_ECORRUPT,
					"model: row slot %u rank %u: consumed count %llu, expected %llu",
					slot, r, (unsigned long long)n, (unsigned long long)expected);
	}
	if (expected > m->core->max_context)
		return eos_fail(SEL_ECORRUPT, "model: row slot %u: consumed %llu beyond max_context %llu",
				slot, (unsigned long long)expected,
				(unsigned long long)m->core->max_context);
	for (uint32_t r = 0; r < m->R; r++)
		if ((rc = check_partial_zero(m, slot, r, expected % m->pt)))
			return rc;
	for (uint32_t r = 0; r < m->R; r++) {
		const uint8_t *row = rowp(m, r, slot);
		struct row_sum *s = rsum(m, slot, r);
		s->S = rec_sum(m, row, shard_salt(m, m->core->recurrent_shard, r));
		s->P = partial_sum(m, row, false);
		s->DP = m->spec ? partial_sum(m, row, true) : m->DP_empty;
	}
	m->row_valid[slot] = true;
	return 0;
}

int hel_model_page_loaded(hel_model *m, uint32_t page)
{
	if (page >= m->pages)
		return eos_fail(-EINVAL, "model: page id %u of %u", page, m->pages);
	struct page_sum *ps = &m->ps[page];
	set_page_sum(m, ps, page_digest(m, page, false), false);
	if (m->spec)
		set_page_sum(m, ps, page_digest(m, page, true), true);
	ps->valid = true;
	return 0;
}

int hel_model_check(const hel_model *m)
{
	for (uint32_t id = 0; id < m->pages; id++) {
		const struct page_sum *ps = &m->ps[id];
		if (!ps->valid)
			continue;
		if (page_digest(m, id, false) != ps->digest ||
		    (m->spec && page_digest(m, id, true) != ps->ddigest))
			return eos_fail(SEL_ECORRUPT, "model check: page id %u changed since it was loaded",
					id);
	}
	for (uint32_t slot = 0; slot < m->rows; slot++) {
		uint64_t n;
		int rc;
		if (!m->row_valid[slot])
			continue;
		if ((rc = consumed_of(m, slot, &n)))
			return rc;
		for (uint32_t r = 0; r < m->R; r++) {
			const uint8_t *row = rowp(m, r, slot);
			const struct row_sum *s = rsum(m, slot, r);
			if ((rc = check_partial_zero(m, slot, r, n % m->pt)))
				return rc;
			if (s->S != rec_sum(m, row, shard_salt(m, m->core->recurrent_shard, r)))
				return eos_fail(SEL_ECORRUPT,
						"model check: row slot %u rank %u: recurrent state changed",
						slot, r);
			if (s->P != partial_sum(m, row, false) ||
			    (m->spec && s->DP != partial_sum(m, row, true)))
				return eos_fail(SEL_ECORRUPT,
						"model check: row slot %u rank %u: partial page changed",
						slot, r);
		}
	}
	return 0;
}

/* ---- The kernel ---------------------------------------------------------------- */

/* Attention over the page table's summaries: out[j] (H lanes). */
static void attend(hel_model *m, const struct ptab *tab, const uint32_t *wq, const uint32_t *wo,
		   const uint32_t *x, bool draft, uint32_t layer, uint32_t *out)
{
	const uint32_t H = m->H;
	uint32_t *q = m->q, *acc = m->acc;
	for (uint32_t k = 0; k < SW; k++) {
		uint32_t s = 0;
		for (uint32_t j = 0; j < H; j++)
			s += wq[k * H + j] * x[j];
		q[k] = s;
		acc[k] = 0;
	}
	uint32_t n = ptab_len(tab);
	for (uint32_t i = 0; i < n; i++) {
		const struct page_sum *ps = &m->ps[ptab_at(tab, i)];
		const uint32_t *kk = draft ? ps->dk : ps->k, *vv = draft ? ps->dv : ps->v;
		uint32_t s = (i + 1) * GOLD32 + layer;
		for (uint32_t k = 0; k < SW; k++)
			s += q[k] * kk[k];
		uint32_t w = (nl32(s) >> 20) | 1;
		for (uint32_t k = 0; k < SW; k++)
			acc[k] += w * vv[k];
	}
	for (uint32_t j = 0; j < H; j++) {
		uint32_t s = n * GOLD32;
		for (uint32_t k = 0; k < SW; k++)
			s += wo[j * SW + k] * acc[k];
		out[j] = s;
	}
}

static inline uint32_t ind_tag(const hel_model *m, uint64_t y)
{
	return (uint32_t)mix64(y ^ m->tag_salt) | 1u;
}

static inline uint64_t ind_index(const hel_model *m, uint64_t y, uint64_t rsr)
{
	return 1 + mix64(y ^ rsr ^ m->ind_salt) % m->T;
}

static inline void rec_set(uint8_t *w, uint64_t *S, uint64_t rsr, uint64_t i, uint64_t v)
{
	uint64_t old = rd64(w + 8 * i);
	*S += rec_term(rsr, i, v) - rec_term(rsr, i, old);
	wr64(w + 8 * i, v);
}

/* Step 4 for one rank: previous token, induction entry, mixing words. */
static void rec_update(const hel_model *m, uint8_t *row, struct row_sum *s, uint64_t rsr,
		       hel_token x, uint64_t zd)
{
	uint8_t *w = row + m->lay.recurrent;
	if (m->W == 0)
		return;
	uint64_t prev = rd64(w);
	rec_set(w, &s->S, rsr, 0, (uint64_t)x + 1);
	if (m->T && prev) {
		uint64_t y = prev - 1;
		rec_set(w, &s->S, rsr, ind_index(m, y, rsr), (uint64_t)ind_tag(m, y) << 32 | x);
	}
	uint32_t u_n = m->M < REC_UPDATES ? (uint32_t)m->M : REC_UPDATES;
	for (uint32_t u = 0; u < u_n; u++) {
		uint64_t h = mix64((zd ^ rsr) + (u + 1) * GOLD);
		uint64_t i = 1 + m->T + h % m->M;
		rec_set(w, &s->S, rsr, i, mix64(rd64(w + 8 * i) ^ h));
	}
}

/* The token rank 0's induction table says followed x last time, or NO_TOKEN. */
static hel_token induction(const hel_model *m, uint32_t slot, hel_token x)
{
	if (!m->T)
		return NO_TOKEN;
	uint64_t rsr = shard_salt(m, m->core->recurrent_shard, 0);
	uint64_t e = rd64(rowp(m, 0, slot) + m->lay.recurrent + 8 * ind_index(m, x, rsr));
	uint32_t t = (uint32_t)e;
	if ((uint32_t)(e >> 32) != ind_tag(m, x) || t >= m->V || !m->gen[t])
		return NO_TOKEN;
	return t;
}

/* Write one token's chunk of every plane of one group on every rank into
 * the partial page at position t, and account for it in P or DP. */
static void write_token(hel_model *m, uint32_t slot, uint32_t t, bool draft, const uint32_t *x)
{
	uint64_t xd = XXH3_64bits(x, (size_t)m->H * 4);
	for (uint32_t r = 0; r < m->R; r++) {
		uint8_t *row = rowp(m, r, slot);
		struct row_sum *s = rsum(m, slot, r);
		for (uint32_t p = 0; p < m->npl; p++) {
			const struct mplane *pl = &m->pl[p];
			if (pl->draft != draft)
				continue;
			uint8_t *dst = row + pl->part + t * pl->tb;
			uint64_t seed = mix64(xd ^ pl->key ^ shard_salt(m, pl->cp->shard, r));
			for (uint64_t i = 0; i < pl->tb / 8; i++)
				wr64(dst + 8 * i, mix64(seed + (i + 1) * GOLD));
			uint64_t h = XXH3_64bits_withSeed(dst, pl->tb, pl->key + t);
			uint64_t *acc = draft ? &s->DP : &s->P;
			*acc += h - m->zero_hash[(size_t)p * m->pt + t];
		}
	}
}

/* Hidden-vector context of a group: c64 and the all-reduced copies. */
static uint64_t main_context(const hel_model *m, uint32_t slot, uint64_t n, uint32_t *hs)
{
	uint64_t c = mix64(n * GOLD + m->pos_salt);
	memset(hs, 0, (size_t)m->H * 4);
	for (uint32_t r = 0; r < m->R; r++) {
		const struct row_sum *s = rsum(m, slot, r);
		const uint8_t *hid = rowp(m, r, slot) + m->lay.hidden;
		c += mix64(s->S + comb(m, r, C_S));
		c += mix64(s->P + comb(m, r, C_P));
		uint32_t wgt = 2 * r + 1;
		for (uint32_t j = 0; j < m->H; j++) {
			uint32_t v;
			memcpy(&v, hid + 4 * j, 4);
			hs[j] += wgt * v;
		}
	}
	return c;
}

static uint64_t draft_context(const hel_model *m, uint32_t slot, uint64_t n, uint32_t *dhs)
{
	uint64_t c = mix64(n * GOLD + m->dpos_salt);
	memset(dhs, 0, (size_t)m->H * 4);
	for (uint32_t r = 0; r < m->R; r++) {
		const uint8_t *row = rowp(m, r, slot);
		c += mix64(XXH3_64bits_withSeed(row + m->lay.draft_history, m->lay.draft_history_bytes,
						comb(m, r, C_HISTORY)));
		c += mix64(rsum(m, slot, r)->DP + comb(m, r, C_DP));
		uint32_t wgt = 2 * r + 1;
		for (uint32_t j = 0; j < m->H; j++) {
			uint32_t v;
			memcpy(&v, row + m->lay.draft_hidden + 4 * j, 4);
			dhs[j] += wgt * v;
		}
	}
	return c;
}

static void project(const hel_model *m, const uint32_t *w, const uint32_t *x, int32_t *logits)
{
	for (uint32_t v = 0; v < m->V; v++) {
		const uint32_t *row = w + (size_t)v * m->H;
		uint32_t acc = 0;
		for (uint32_t j = 0; j < m->H; j++)
			acc += row[j] * x[j];
		logits[v] = m->gen[v] ? (int32_t)(acc >> 18) - 8192 : HEL_LOGIT_MASKED;
	}
}

static int check_table(const hel_model *m, uint32_t slot, const struct ptab *tab, uint64_t *n_out)
{
	uint64_t n;
	int rc;
	if (slot >= m->rows || !m->row_valid[slot])
		return eos_fail(-EINVAL, "model: row slot %u holds no sequence (init or load it)", slot);
	if ((rc = consumed_of(m, slot, &n)))
		return rc;
	uint32_t np = ptab_len(tab);
	if (np != n / m->pt)
		return eos_fail(SEL_ECORRUPT,
				"model: row slot %u consumed %llu tokens, so %llu complete pages, but "
				"the page table has %u",
				slot, (unsigned long long)n, (unsigned long long)(n / m->pt), np);
	for (uint32_t i = 0; i < np; i++) {
		uint32_t id = ptab_at(tab, i);
		if (id >= m->pages || !m->ps[id].valid)
			return eos_fail(-EINVAL, "model: page table entry %u: page id %u %s", i, id,
					id >= m->pages ? "out of range" : "holds no loaded page");
	}
	*n_out = n;
	return 0;
}

/* embed: NULL for a vocabulary token; at an image-token position (x is
 * HEL_TOK_IMAGE) that position's image-token state, added to the
 * embedding. */
static int step(hel_model *m, uint32_t slot, const struct ptab *tab, hel_token x,
		uint32_t next_page, int32_t *logits, bool *page_done, const uint32_t *embed)
{
	const uint32_t H = m->H;
	uint32_t *z = m->z, *lane = m->lane, *att = m->att;
	uint64_t n;
	int rc;

	if ((rc = check_table(m, slot, tab, &n)))
		return rc;
	if (x >= m->V)
		return eos_fail(-EINVAL, "model: token %u outside the vocabulary (%u)", x, m->V);
	if (x == HEL_TOK_IMAGE && m->core->has_image && !embed)
		return eos_fail(-EINVAL, "model: an image token without its image-token state "
				"(hel_model_prefill_image consumes images)");
	if (n >= m->core->max_context)
		return eos_fail(-E2BIG, "model: row slot %u is full (max_context %llu tokens)", slot,
				(unsigned long long)m->core->max_context);
	uint32_t t = (uint32_t)(n % m->pt);
	bool completes = t == m->pt - 1;
	if (completes) {
		if (next_page >= m->pages)
			return eos_fail(-EINVAL,
					"model: token %llu completes a page but next page id %u is "
					"out of range",
					(unsigned long long)n, next_page);
		for (uint32_t i = 0; i < ptab_len(tab); i++)
			if (ptab_at(tab, i) == next_page)
				return eos_fail(-EINVAL,
						"model: next page %u is already in the page table",
						next_page);
	}

	/* 1-2: context and embedding. */
	uint64_t c = main_context(m, slot, n, m->hs);
	lanes(c, lane, H);
	for (uint32_t j = 0; j < H; j++)
		z[j] = nl32(m->emb[(size_t)x * H + j] + (embed ? embed[j] : 0) +
			    rotl32(m->hs[j], 5) + lane[j]);
	/* 3: attention blocks. */
	for (uint32_t l = 0; l < m->L; l++) {
		attend(m, tab, m->wq + (size_t)l * SW * H, m->wo + (size_t)l * SW * H, z, false, l, att);
		for (uint32_t j = 0; j < H; j++)
			z[j] = nl32(z[j] + att[j] + l);
	}
	/* 4: recurrent update and its output. */
	uint64_t zd = XXH3_64bits(z, (size_t)H * 4), rec = 0;
	for (uint32_t r = 0; r < m->R; r++) {
		struct row_sum *s = rsum(m, slot, r);
		rec_update(m, rowp(m, r, slot), s, shard_salt(m, m->core->recurrent_shard, r), x, zd);
		rec += mix64(s->S + comb(m, r, C_REC));
	}
	lanes(rec ^ zd, lane, H);
	for (uint32_t j = 0; j < H; j++)
		z[j] = nl32(z[j] ^ lane[j]);
	/* 5: the new hidden and the token's bytes. */
	for (uint32_t r = 0; r < m->R; r++)
		memcpy(rowp(m, r, slot) + m->lay.hidden, z, (size_t)H * 4);
	write_token(m, slot, t, false, z);
	/* 6: draft state. */
	if (m->spec) {
		uint32_t *d = m->d;
		uint64_t dc = draft_context(m, slot, n, m->dhs);
		lanes(dc, lane, H);
		for (uint32_t j = 0; j < H; j++)
			d[j] = nl32(m->demb[(size_t)x * H + j] + rotl32(m->dhs[j], 3) + lane[j] +
				    rotl32(z[j], 11));
		attend(m, tab, m->dwq, m->dwo, d, true, 0, att);
		for (uint32_t j = 0; j < H; j++)
			d[j] = nl32(d[j] + att[j]);
		for (uint32_t r = 0; r < m->R; r++) {
			uint8_t *row = rowp(m, r, slot);
			memcpy(row + m->lay.draft_hidden, d, (size_t)H * 4);
			uint32_t tok = x;
			memcpy(row + m->lay.draft_history + 4 * (n % m->Hd), &tok, 4);
		}
		write_token(m, slot, t, true, d);
	}
	for (uint32_t r = 0; r < m->R; r++)
		wr64(rowp(m, r, slot) + m->lay.consumed, n + 1);
	/* A completed page moves to next_page on every plane and rank. */
	if (completes) {
		struct page_sum *ps = &m->ps[next_page];
		uint64_t dig = 0, ddig = 0;
		for (uint32_t r = 0; r < m->R; r++) {
			uint8_t *row = rowp(m, r, slot);
			struct row_sum *s = rsum(m, slot, r);
			for (uint32_t p = 0; p < m->npl; p++) {
				memcpy(pagep(m, r, p, next_page), row + m->pl[p].part, m->pl[p].unit);
				memset(row + m->pl[p].part, 0, m->pl[p].unit);
			}
			dig += mix64(s->P + comb(m, r, C_PAGE));
			ddig += mix64(s->DP + comb(m, r, C_DPAGE));
			s->P = m->P_empty;
			s->DP = m->DP_empty;
		}
		set_page_sum(m, ps, dig, false);
		if (m->spec)
			set_page_sum(m, ps, ddig, true);
		ps->valid = true;
	}
	if (page_done)
		*page_done = completes;
	/* 7: logits. */
	if (logits) {
		project(m, m->wout, z, logits);
		hel_token b = induction(m, slot, x);
		if (b != NO_TOKEN)
			logits[b] += INDUCTION_BONUS;
	}
	return 0;
}

int hel_model_step(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		   hel_token token, uint32_t next_page, int32_t *logits)
{
	struct ptab tab = { pages, n_pages, HEL_NO_PAGE };
	return step(m, slot, &tab, token, next_page, logits, NULL, NULL);
}

/* A prefill chunk of n positions: tokens[i], or (tokens NULL) image-token
 * positions with states[i x hidden ..) added to HEL_TOK_IMAGE. */
static int prefill(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		   const hel_token *tokens, const uint32_t *states, size_t n, int32_t *logits)
{
	uint64_t c;
	int rc;
	if (slot >= m->rows || !m->row_valid[slot])
		return eos_fail(-EINVAL, "model: row slot %u holds no sequence (init or load it)", slot);
	if ((rc = consumed_of(m, slot, &c)))
		return rc;
	if (n == 0 && logits)
		return eos_fail(-EINVAL, "model: logits of an empty chunk");
	if (n_pages != (c + n) / m->pt)
		return eos_fail(-EINVAL,
				"model: a chunk of %zu tokens after %llu needs a page table of %llu "
				"pages, not %u",
				n, (unsigned long long)c, (unsigned long long)((c + n) / m->pt), n_pages);
	for (size_t i = 0; i < n; i++) {
		uint64_t pos = c + i;
		struct ptab tab = { pages, (uint32_t)(pos / m->pt), HEL_NO_PAGE };
		uint32_t next = pos % m->pt == m->pt - 1 ? pages[pos / m->pt] : HEL_NO_PAGE;
		if ((rc = step(m, slot, &tab, tokens ? tokens[i] : HEL_TOK_IMAGE, next,
			       i + 1 == n ? logits : NULL, NULL, tokens ? NULL : states + i * m->H)))
			return rc;
	}
	return 0;
}

int hel_model_prefill(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		      const hel_token *tokens, size_t n, int32_t *logits)
{
	static const hel_token none[1]; /* an empty chunk may pass no tokens */
	if (!tokens && n)
		return eos_fail(-EINVAL, "model: a chunk of %zu tokens without the tokens", n);
	return prefill(m, slot, pages, n_pages, tokens ? tokens : none, NULL, n, logits);
}

/* ---- Vision (cores with an [image] section) ------------------------------------ */

int hel_model_image_states(const hel_model *m, const sel_input_rec *prepared, uint32_t *states)
{
	uint32_t n;
	int rc;
	if ((rc = hel_vision_check(m->core, prepared, &n)))
		return rc;
	const sel_input_tensor *pt = &prepared->h.tensors[sel_input_find(prepared, HEL_VISION_PIXELS)];
	const sel_input_tensor *gt = &prepared->h.tensors[sel_input_find(prepared, HEL_VISION_GRID)];
	const uint8_t *px = prepared->bytes + pt->offset;
	uint64_t E = pt->dims[1];
	/* The image as a whole: every token's hash and the grid. */
	uint64_t g = mix64(XXH3_64bits_withSeed(prepared->bytes + gt->offset, 8, m->vis_salt));
	for (uint32_t t = 0; t < n; t++)
		g += mix64(XXH3_64bits_withSeed(px + t * E, E, m->vis_salt + t) + t * GOLD);
	for (uint32_t t = 0; t < n; t++) {
		uint64_t h = XXH3_64bits_withSeed(px + t * E, E, m->vis_salt + t);
		lanes(mix64(h ^ m->vis_salt) ^ mix64(g + (t + 1) * GOLD), states + (size_t)t * m->H,
		      m->H);
	}
	return (int)n;
}

int hel_model_prefill_image(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
			    const uint32_t *states, size_t n, int32_t *logits)
{
	if (!m->core->has_image)
		return eos_fail(-EINVAL, "model: core '%s' has no [image] section: it takes no images",
				m->core->name);
	if (n && !states)
		return eos_fail(-EINVAL, "model: image positions without their states");
	return prefill(m, slot, pages, n_pages, NULL, states, n, logits);
}

int hel_model_logits(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		     int32_t *logits)
{
	struct ptab tab = { pages, n_pages, HEL_NO_PAGE };
	uint64_t n;
	int rc;
	if ((rc = check_table(m, slot, &tab, &n)))
		return rc;
	if (n == 0)
		return eos_fail(-EINVAL, "model: row slot %u holds no token to take logits after", slot);
	/* Step 5 wrote z to every rank's hidden region and step 7 projected
	 * that same z: read it back, insisting the replicas agree. */
	const uint8_t *h0 = rowp(m, 0, slot) + m->lay.hidden;
	for (uint32_t r = 1; r < m->R; r++)
		if (memcmp(rowp(m, r, slot) + m->lay.hidden, h0, m->lay.hidden_bytes))
			return eos_fail(SEL_ECORRUPT,
					"model: row slot %u: rank %u's hidden vector differs from rank 0's",
					slot, r);
	memcpy(m->z, h0, (size_t)m->H * 4);
	project(m, m->wout, m->z, logits);
	/* Word 0 of the recurrent state is the last consumed token + 1: the
	 * token whose induction entry step 7 consulted (after its update). */
	if (m->W) {
		uint64_t w0 = rd64(rowp(m, 0, slot) + m->lay.recurrent);
		if (w0 == 0 || w0 - 1 >= m->V)
			return eos_fail(SEL_ECORRUPT,
					"model: row slot %u: previous token word %llu is not a token",
					slot, (unsigned long long)w0);
		hel_token b = induction(m, slot, (hel_token)(w0 - 1));
		if (b != NO_TOKEN)
			logits[b] += INDUCTION_BONUS;
	}
	return 0;
}

/* ---- Sampling, drafting, verification -------------------------------------------- */

hel_token hel_sample(const int32_t *logits, uint32_t vocab, const hel_sampler *s, uint64_t position)
{
	uint32_t best = 0;
	for (uint32_t v = 1; v < vocab; v++)
		if (logits[v] > logits[best])
			best = v;
	if (!s || !(s->temperature > 0))
		return best;
	/* Softmax at temperature, summed in id order; the draw is fixed by
	 * (seed, position). */
	double scale = 1.0 / (s->temperature * HEL_LOGIT_SCALE), total = 0;
	for (uint32_t v = 0; v < vocab; v++)
		if (logits[v] > HEL_LOGIT_MASKED)
			total += exp((double)(logits[v] - logits[best]) * scale);
	double u = (double)(mix64(s->seed ^ mix64(position * GOLD + 0x5a3d)) >> 11) * 0x1p-53 * total;
	double cum = 0;
	for (uint32_t v = 0; v < vocab; v++) {
		if (logits[v] <= HEL_LOGIT_MASKED)
			continue;
		cum += exp((double)(logits[v] - logits[best]) * scale);
		if (u < cum)
			return v;
	}
	return best;
}

void hel_logprobs(const int32_t *logits, uint32_t vocab, hel_token token, uint32_t top,
		  hel_logprob *out)
{
	memset(out, 0, sizeof *out);
	if (top > HEL_TOP_LOGPROBS_MAX)
		top = HEL_TOP_LOGPROBS_MAX;
	int32_t best = HEL_LOGIT_MASKED;
	for (uint32_t v = 0; v < vocab; v++)
		if (logits[v] > best)
			best = logits[v];
	/* log(sum exp) in nats, relative to the best logit. */
	double total = 0;
	for (uint32_t v = 0; v < vocab; v++)
		if (logits[v] > HEL_LOGIT_MASKED)
			total += exp((double)(logits[v] - best) / HEL_LOGIT_SCALE);
	double lse = (double)best / HEL_LOGIT_SCALE + log(total > 0 ? total : 1);
	out->logprob = token < vocab && logits[token] > HEL_LOGIT_MASKED
			       ? (float)((double)logits[token] / HEL_LOGIT_SCALE - lse)
			       : -INFINITY;
	/* The top ids by insertion into a sorted list of at most top entries. */
	for (uint32_t v = 0; v < vocab && top; v++) {
		if (logits[v] <= HEL_LOGIT_MASKED)
			continue;
		uint32_t k = out->n_top;
		if (k == top && logits[v] <= logits[out->top[k - 1]])
			continue;
		if (k == top)
			k--;
		while (k > 0 && logits[out->top[k - 1]] < logits[v]) {
			out->top[k] = out->top[k - 1];
			k--;
		}
		out->top[k] = v;
		if (out->n_top < top)
			out->n_top++;
	}
	for (uint32_t i = 0; i < out->n_top; i++)
		out->top_logprob[i] = (float)((double)logits[out->top[i]] / HEL_LOGIT_SCALE - lse);
}

static uint32_t argmax(const int32_t *l, uint32_t n)
{
	uint32_t best = 0;
	for (uint32_t v = 1; v < n; v++)
		if (l[v] > l[best])
			best = v;
	return best;
}

/* Token at sequence position pos in a draft history ring of Hd tokens. */
static inline hel_token ring_at(const uint8_t *ring, uint32_t Hd, uint64_t pos)
{
	uint32_t v;
	memcpy(&v, ring + 4 * (pos % Hd), 4);
	return v;
}

static int propose(hel_model *m, uint32_t slot, const struct ptab *tab, hel_token after,
		   hel_token *out, uint32_t max)
{
	uint64_t n;
	int rc;
	if (!m->spec)
		return eos_fail(-EINVAL, "model: drafts need a speculative state mode");
	if ((rc = check_table(m, slot, tab, &n)))
		return rc;
	if (max > HEL_DRAFT_MAX)
		max = HEL_DRAFT_MAX;
	if (max == 0)
		return 0;
	if (m->mode == SEL_MODE_COPY && n >= 3) {
		const uint8_t *ring = rowp(m, 0, slot) + m->lay.draft_history;
		hel_token last = ring_at(ring, m->Hd, n - 1);
		uint64_t lo = n > m->Hd ? n - m->Hd : 0;
		for (uint64_t p = n - 2; p-- > lo;) { /* p = n-3 down to lo */
			if (ring_at(ring, m->Hd, p) != last || ring_at(ring, m->Hd, p + 1) != after)
				continue;
			uint32_t k = 0;
			for (uint64_t q = p + 2; q < n && k < max; q++)
				out[k++] = ring_at(ring, m->Hd, q);
			return (int)k;
		}
	}
	/* The draft head: chain the draft hidden through its own projection,
	 * preferring what followed the current token last time in the
	 * history (the cue the model's induction table follows). */
	const uint8_t *ring = rowp(m, 0, slot) + m->lay.draft_history;
	uint64_t lo = n > m->Hd ? n - m->Hd : 0;
	const uint32_t H = m->H;
	uint32_t *dd = m->d, *lane = m->lane, *att = m->att;
	uint64_t dc = draft_context(m, slot, n, m->dhs);
	attend(m, tab, m->dwq, m->dwo, m->dhs, true, 1, att);
	memcpy(dd, m->dhs, (size_t)H * 4);
	hel_token cur = after;
	for (uint32_t k = 0; k < max; k++) {
		lanes(dc + k * GOLD, lane, H);
		for (uint32_t j = 0; j < H; j++)
			dd[j] = nl32(dd[j] + m->demb[(size_t)(cur < m->V ? cur : 0) * H + j] + lane[j] +
				     att[j]);
		project(m, m->dout, dd, m->logits);
		for (uint64_t p = n; p-- > lo + 1;) { /* p = n-1 down to lo+1 */
			if (ring_at(ring, m->Hd, p - 1) != cur)
				continue;
			hel_token f = ring_at(ring, m->Hd, p);
			if (f < m->V && m->gen[f])
				m->logits[f] += DRAFT_BONUS;
			break;
		}
		cur = argmax(m->logits, m->V);
		out[k] = cur;
		if (cur == HEL_TOK_END)
			return (int)k + 1;
	}
	return (int)max;
}

int hel_model_propose(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		      hel_token after, hel_token *out, uint32_t max)
{
	struct ptab tab = { pages, n_pages, HEL_NO_PAGE };
	return propose(m, slot, &tab, after, out, max);
}

int hel_model_decode(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		     uint32_t next_page, hel_token pending, const hel_sampler *s,
		     uint32_t max_tokens, hel_round *out)
{
	struct ptab tab = { pages, n_pages, HEL_NO_PAGE };
	int32_t *logits = m->logits;
	uint64_t n;
	bool done;
	int rc;

	memset(out, 0, sizeof *out);
	if (max_tokens == 0)
		return eos_fail(-EINVAL, "model: a decode round of zero tokens");
	if (max_tokens > HEL_DRAFT_MAX + 1)
		max_tokens = HEL_DRAFT_MAX + 1;
	if ((rc = step(m, slot, &tab, pending, next_page, logits, &done, NULL)))
		return rc;
	if (done) {
		out->page_used = true;
		tab.extra = next_page;
	}
	if ((rc = consumed_of(m, slot, &n)))
		return rc;
	hel_token g = hel_sample(logits, m->V, s, n);
	out->tokens[out->n_tokens++] = g;
	if (!m->spec || g == HEL_TOK_END || out->n_tokens >= max_tokens)
		return 0;
	uint32_t want = m->K < max_tokens - 1 ? m->K : max_tokens - 1;
	if ((rc = propose(m, slot, &tab, g, out->proposed, want)) < 0)
		return rc;
	out->n_proposed = (uint32_t)rc;
	for (uint32_t i = 0; i < out->n_proposed; i++) {
		if (g == HEL_TOK_END || out->n_tokens >= max_tokens || n >= m->core->max_context)
			break;
		if ((rc = step(m, slot, &tab, g, out->page_used ? HEL_NO_PAGE : next_page, logits,
			       &done, NULL)))
			return rc;
		if (done) {
			out->page_used = true;
			tab.extra = next_page;
		}
		n++;
		hel_token v = hel_sample(logits, m->V, s, n);
		out->tokens[out->n_tokens++] = v;
		if (v != out->proposed[i])
			break;
		out->accepted++;
		g = v;
	}
	return 0;
}
