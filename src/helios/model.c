/*
 * model.c - the synthetic model of the reference engine (ARCHITECTURE.md
 * "The reference engine's model"; design 2.1 "Checkpoint bytes"; design 1
 * and issue 19 for speculative decoding).
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
 *   One per-token kernel (consume) serves prefill and decode, so chunking
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
 *     6. speculative modes update the draft state from the draft hidden,
 *        the token and z: draft history ring, draft hidden, draft planes.
 *   The output head (positions that need logits only) then gives
 *     7. logits[v] = fine(v) + coarse(x, v) + induction bonus, for v among
 *        printable ASCII, newline and END (the rest are masked): fine is
 *        the full-rank projection of z (integer, wrapping, about +-0.5
 *        nat), coarse a rank-16 product of small factors of the consumed
 *        token and the position and of signs of v (a preference of a few
 *        nats, bounded), and the bonus (larger than the others can
 *        differ) goes to what followed the last three tokens last time
 *        (the induction table), so a repeated context is copied.  fine is
 *        what ties the output to every stored byte; coarse and the bonus
 *        are the structure a cheap draft can learn (below).
 *   Summaries keep the cost per token at O(pages x lanes x layers + row
 *   context + the token's plane bytes) instead of O(context bytes): a page
 *   summary is a function of every byte of the page on every plane and rank
 *   (sum of XXH3 of each token's chunk of each plane, rank-salted); a row's
 *   recurrent summary is sum_i mix(word_i, i) over every state word, its
 *   partial summary the same XXH3 sum over its partial page.  They are
 *   maintained incrementally by the kernel and recomputed from the bytes by
 *   hel_model_page_loaded() and hel_model_row_loaded() after a restore.
 *   Landed summaries (issue 18).  Recomputing a restore's summaries reads
 *   every restored byte once more on the worker after the copy (for a 32K
 *   Qwen prefix, 500 MiB: 185 ms after a 95 ms copy).  So a restore may be
 *   summarised where its bytes land: the engine arms its destination ids
 *   (hel_model_load_expect: one seq per restore, before the fetch), the
 *   store's transfer threads call hel_model_landed after each window of
 *   their rank lands (a sel_landed_hook), which stores that rank's terms
 *   of the page digests (page_term) and its row summaries with the armed
 *   seq (a row the store hands over in pieces, sel_landed_hook row_piece,
 *   has its recurrent sum added up piece by piece by hel_model_row_piece
 *   from each piece's source while the copy left it in the cache (so the
 *   row is not read back from memory), and taken by hel_model_landed's row
 *   call only if every piece came in order from byte 0; otherwise that
 *   call sums the row from its bytes), and page_loaded / row_loaded take
 *   a rank's stored terms when their seq is the armed one and compute
 *   from the bytes otherwise (no hook,
 *   CUDA planes, a store path without per-window copies, another rank's
 *   process).  The result is the same sum either way: page_digest is the
 *   sum of the ranks' terms.  Correctness rests on ownership (design
 *   2.12): the destination ids belong to the restore from the fetch to its
 *   event, so nothing writes them between the hook and the load, and the
 *   hook's writes are ordered before the event by the transfer set's
 *   completion.  Every load, and every write the model makes to an id
 *   (a completed page, row_init, row_copy), disarms it, as does
 *   hel_model_load_cancel on a failed restore, so a stored term is used
 *   only by the restore it was computed for.  The consumed count and the
 *   canonical partial page are still checked on the worker (a few hundred
 *   KiB), and hel_model_check still recomputes from the bytes, so a byte
 *   written after landing is caught (debug builds compare at the load).
 *   The hidden vectors, consumed counts and draft history are read whole
 *   every token.  All state arithmetic is on unsigned integers modulo 2^32
 *   or 2^64 with bijective mixers, so one flipped bit changes a summary
 *   with certainty and the logits with overwhelming probability; sampling
 *   at a temperature uses doubles in a fixed order, outside the kernel.
 *   hel_model_logits re-derives step 7 from the row alone (its hidden
 *   vector and its previous-token word), so a request restored at the end
 *   of its prompt samples exactly what the step that ended there did.
 *
 *   Launches and the weight stream (the cost model).  The model keeps no
 *   weight matrices.  A launch derives every weight it multiplies by from
 *   the seed once -- the attention projections when it consumes a token,
 *   the output head's rows when it computes logits, the draft head's when
 *   it drafts -- and every position of the launch uses them.  On a GPU a
 *   decode step is bound by reading the weights, and the positions of a
 *   launch share that read; the derivation is that read here.  Without it
 *   the CPU model's cache-resident weights would make a launch of k+1
 *   positions cost k+1 single steps, and speculation could only lose.
 *   docs/performance.md has the figures (derivation against arithmetic per
 *   position) and what they mean.
 *
 *   Drafts.  Speculative modes keep draft state in the row and the draft
 *   planes: the draft history ring, the draft hidden vector and the draft
 *   planes' partial page (updated by step 6 for every consumed token) and
 *   the draft planes of every page.  The draft head reads all of it: its
 *   state vector is the draft hidden plus attention over the draft planes'
 *   page summaries, mixed with a hash of the history ring and the draft
 *   partial page's summary, then chained through each proposal's token.
 *   Its logits are a truncated version of step 7: the same coarse factors
 *   (exact), the induction bonus from the history ring instead of the
 *   recurrent table (the same answer while the previous occurrence is in
 *   the ring), and a narrow fine term over 8 lanes of its own state
 *   (about +-0.5 nat) instead of the full-rank projection of z.  Copy mode
 *   proposes the continuation of the longest earlier match (up to
 *   COPY_MATCH_MAX tokens) of the latest tokens in the history ring,
 *   extended periodically, and falls back to the draft head when nothing
 *   matches.  Draft state never feeds the main logits, so every mode emits
 *   the same tokens at temperature 0 while speculative records carry
 *   draft bytes (and a state mode) that give them their own namespace.
 *
 *   Rounds (hel_model_decode).  Pending is consumed and its logits taken,
 *   the draft proposes k tokens, and verification walks them in the same
 *   launch: each proposal is decided against the main logits at its
 *   position, and only an accepted one is consumed to get the logits for
 *   the next.  The first rejection emits the main model's token there and
 *   ends the round, so rejected proposals never touch the row or the
 *   pages: nothing needs rolling back, and the row after a round is the
 *   row after ordinary decoding of the emitted tokens.  A proposal is
 *   never consumed where it would complete a page (the round ends with it
 *   emitted, unconsumed); pending, consumed first, is the only token of a
 *   round that completes one, into next_page as in ordinary decoding.
 *   Speculative sampling: with a point-mass draft (copy, greedy) the
 *   acceptance test min(1, p(d)/1) and the residual max(0, p - q) are the
 *   ordinary draw itself (sample from p; accept if it is d, else what it
 *   drew is the residual sample), so copy mode emits the ordinary tokens
 *   at every temperature; the learned draft samples d from its q, accepts
 *   with probability min(1, p(d)/q(d)) and otherwise draws from the
 *   normalised residual.  Every draw is a function of (seed, position,
 *   purpose), so a restored request repeats its proposals and choices.
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
 *      launches, or anything else.
 *   5. The weights derived in a launch are used only within it (the
 *      launch's flags say which are current).
 */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "xxh.h"

#include "eos.h"
#include "model.h"
#include "model_sum.h"
#include "vision.h"

#define GOLD 0x9E3779B97F4A7C15ull
#define GOLD32 0x9E3779B9u
#define SW HEL_SUMMARY_LANES
#define REC_UPDATES 16        /* mixing words updated per token per rank */
#define INDUCTION_BONUS 28672 /* 28 nats: more than coarse and fine can differ */
#define FINE_SHIFT 22         /* fine logits: (acc >> 22) - 512, about +-0.5 nat */
#define COARSE_UNIT 1024      /* the coarse term: 1 nat per leading zero of a hash, */
#define COARSE_LZ_MAX 12      /* at most 12, so within 13 nats */
#define DRAFT_LANES 8         /* the draft head's fine term: 8 lanes of its state */
#define DRAFT_SHIFT 23        /* (acc >> 23) - 256: about +-0.25 nat */
#define COPY_MATCH_MIN 3      /* copy drafting: the shortest match it follows */
#define COPY_MATCH_MAX 16     /* and the longest it looks for */
#define NO_TOKEN UINT32_MAX

/* Salt tags: each use of the seed gets its own (tag, index) pair. */
enum {
	T_EMB = 1,
	T_WQ,
	T_WO,
	T_WOUT,
	T_H0,
	T_DEMB,
	T_DWQ,
	T_DWO,
	T_DOUT,
	T_D0,
	T_POS,
	T_DPOS,
	T_SPLIT,
	T_REP,
	T_COMB,
	T_IND,
	T_TAG,
	T_PLANE,
	T_KLANE,
	T_VLANE,
	T_VISION,   /* vision cores only: text cores use none of it */
	T_COARSE_X, /* the coarse term (issue 19) */
};
/* Per-rank salts combining that rank's summaries into the model's inputs. */
enum {
	C_S,
	C_P,
	C_HISTORY,
	C_DP,
	C_PAGE,
	C_DPAGE,
	C_REC,
	COMB_SALTS
};
/* What a draw decides (hel_sample's own draw is the ordinary one). */
enum {
	D_DRAFT = 0x1d8e,
	D_ACCEPT = 0x7a11,
	D_RESIDUAL = 0x3c59,
	D_SAMPLE = 0x5a3d
};

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

static inline uint32_t rotl32(uint32_t x, unsigned r) { return x << r | x >> (32 - r); }

/* n (even) pseudo-random lanes from c. */
static void lanes(uint64_t c, uint32_t *out, uint32_t n)
{
	for (uint32_t j = 0; j < n; j += 2) {
		uint64_t v = mix64(c + (j + 1) * GOLD);
		out[j] = (uint32_t)v;
		out[j + 1] = (uint32_t)(v >> 32);
	}
}

/* sum_j a[j] x b[j] modulo 2^32, n a multiple of 4: four lanes at a time
 * (GCC vector extensions; SSE2 on x86-64).  Modular sums do not depend on
 * their order, so this is bit-exact with the scalar loop. */
typedef uint32_t v4u __attribute__((vector_size(16)));

static inline uint32_t dot(const uint32_t *a, const uint32_t *b, uint32_t n)
{
	v4u s = {0, 0, 0, 0};
	for (uint32_t j = 0; j < n; j += 4) {
		v4u x, y;
		memcpy(&x, a + j, sizeof x);
		memcpy(&y, b + j, sizeof y);
		s += x * y;
	}
	return s[0] + s[1] + s[2] + s[3];
}

static inline uint64_t rd64(const uint8_t *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}

static inline void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

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
	uint64_t local, dlocal; /* this process's ranks' share of the digests */
	bool valid;
};

struct row_sum {
	uint64_t S;  /* recurrent state */
	uint64_t P;  /* partial page, main planes */
	uint64_t DP; /* partial page, draft planes */
};

/* A rank's share of a landed page's digests (the terms page_digest sums)
 * and of a landed row's summaries, with the seq of the restore they were
 * computed for (transfer threads write them, the worker reads them after
 * the restore's event). */
struct page_pre {
	uint64_t seq;
	uint64_t term, dterm;
};

struct row_pre {
	uint64_t seq;
	struct row_sum s;
	bool pieces; /* s.S was summed as the row's pieces landed */
	/* hel_model_row_piece's running sum for the restore armed with
	 * piece_seq (0: none): the row's bytes [0, piece_end) landed, its
	 * recurrent words [0, piece_words) are summed in piece_S. */
	uint64_t piece_seq, piece_end, piece_words, piece_S;
};

struct ptab {
	const uint32_t *ids;
	uint32_t n;
	uint32_t extra; /* one more id after ids[n-1], or HEL_NO_PAGE */
};

static inline uint32_t ptab_len(const struct ptab *t) { return t->n + (t->extra != HEL_NO_PAGE); }

static inline uint32_t ptab_at(const struct ptab *t, uint32_t i)
{
	return i < t->n ? t->ids[i] : t->extra;
}

struct hel_model {
	const hel_core *core;
	sel_state_mode mode;
	bool spec;
	uint32_t R, H, L, V, pt, Hd, K;
	uint32_t lo, hi; /* the ranks this process holds (all but with tp) */
	hel_model_tp tp; /* reduce NULL: every rank here */
	uint64_t *red;   /* [1 + H]: a reduction's words */
	uint32_t pages, rows;
	hel_row_layout lay;
	struct mplane *pl; /* [npl]: main planes, then drafts */
	uint32_t npl, nmain;
	uint8_t **pbase;     /* [R * npl] */
	uint8_t **rbase;     /* [R] */
	size_t *pmap;        /* [npl] mapping length per plane */
	size_t rmap;         /* per rank */
	struct page_sum *ps; /* [pages] */
	struct row_sum *rs;  /* [rows * R] */
	bool *row_valid;     /* [rows] */
	/* Landed summaries (DESIGN): restores expected, and the summaries the
	 * transfer threads computed of their landed bytes, per rank. */
	uint64_t load_seq;         /* the last restore expected */
	uint64_t *arm_page;        /* [pages]: its restore's seq, or 0 */
	uint64_t *arm_row;         /* [rows] */
	struct page_pre *pre_page; /* [pages * R] */
	atomic_bool idle;          /* hel_model_worker_idle: the worker waits */
	struct row_pre *pre_row;   /* [rows * R] */
	uint64_t *zero_hash;       /* [npl * pt] */
	uint64_t P_empty, DP_empty;
	uint64_t *S_zero;     /* [R] */
	uint64_t *split_salt; /* [R] */
	uint64_t rep_salt;
	uint64_t *comb; /* [R * COMB_SALTS] */
	uint64_t pos_salt, dpos_salt, ind_salt, tag_salt;
	uint64_t vis_salt; /* vision cores: the image-token state salt */
	/* recurrent geometry, in words */
	uint64_t W, T, M;
	/* Weights: the salts of their streams (derived, never stored whole),
	 * and the initial hidden vectors. */
	uint64_t s_emb, s_wq, s_wo, s_wout, s_demb, s_dout, s_cx;
	uint32_t *h0, *d0;
	uint8_t *gen;       /* [V]: 1 if the model may generate the token */
	hel_token *genlist; /* [G]: those tokens, ascending */
	uint32_t G;
	/* The current launch (DESIGN "Launches") and the weights it derived. */
	uint32_t depth;
	bool have_attn, have_head, have_draft;
	uint32_t *wq, *wo; /* [L * SW * H] */
	uint32_t *wout;    /* [G * H]: output rows of the generated tokens */
	uint32_t *dout;    /* [G * DRAFT_LANES]: its narrow output rows */
	hel_model_counts counts;
	/* scratch (one thread) */
	uint32_t *z, *hs, *lane, *att, *d, *dhs, *erow;
	uint32_t q[SW], acc[SW];
	int32_t *logits; /* [V] */
	int32_t *rl;     /* [(HEL_DRAFT_MAX + 1) * V]: a round's logits */
	double *pv, *qv; /* [G] target, [HEL_DRAFT_MAX * G] draft probabilities */
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

/* The tensor-parallel all-reduce (model.h "Ranks in separate processes"):
 * with every rank in this process, the sums are already whole. */
static int tp_sum(hel_model *m, uint64_t *w, size_t n)
{
	return m->tp.reduce ? m->tp.reduce(m->tp.ctx, w, n) : 0;
}

/* Rank 0 mirrors a call to the peers before running it. */
static int tp_mirror(hel_model *m, const hel_tp_call *c)
{
	return m->tp.call ? m->tp.call(m->tp.ctx, c) : 0;
}

/* Logits read rank 0's row (its induction table): a peer never takes any. */
static int tp_logits(const hel_model *m, const int32_t *logits)
{
	if (logits && m->lo != 0)
		return eos_fail(-EINVAL, "model: rank %u takes no logits (rank 0 samples)", m->lo);
	return 0;
}

static inline uint64_t shard_salt(const hel_model *m, hel_shard s, uint32_t r)
{
	return s == HEL_SHARD_SPLIT ? m->split_salt[r] : m->rep_salt;
}

static inline uint64_t seed_salt(const hel_core *c, uint64_t tag, uint64_t index)
{
	return mix64(c->seed ^ mix64(tag * GOLD + index)); /* index < 2^32: no collisions */
}

/* Words [first, first + n) of the weight stream `salt` (first and n even):
 * the pair at i is mix64(salt + (i + 1) x GOLD), low half first. */
static void derive(uint32_t *w, uint64_t salt, size_t first, size_t n)
{
	for (size_t i = 0; i < n; i += 2) {
		uint64_t v = mix64(salt + (first + i + 1) * GOLD);
		w[i] = (uint32_t)v;
		w[i + 1] = (uint32_t)(v >> 32);
	}
}

/* The coarse term of generated token v after consumed token x at the
 * position after c consumed tokens: each token's own value from a hash of
 * (x, c, v), geometric-tailed (COARSE_UNIT per leading zero of the hash,
 * at most COARSE_LZ_MAX, plus low bits for the rest), so that at every
 * position a few tokens stand out by a few nats, every token as often as
 * any other, and the draft head computes exactly the same. */
static inline uint64_t coarse_position(const hel_model *m, hel_token x, uint64_t c)
{
	return mix64(m->s_cx ^ mix64((uint64_t)x * GOLD + c));
}

static inline int32_t coarse(uint64_t hx, hel_token v)
{
	uint64_t h = mix64(hx + ((uint64_t)v + 1) * GOLD);
	uint32_t lz = h ? (uint32_t)__builtin_clzll(h) : 64;
	if (lz > COARSE_LZ_MAX)
		lz = COARSE_LZ_MAX;
	return (int32_t)((uint64_t)lz * COARSE_UNIT + (h & (COARSE_UNIT - 1)));
}

/* ---- Launches --------------------------------------------------------------- */

static void enter(hel_model *m)
{
	if (m->depth++ == 0)
		m->have_attn = m->have_head = m->have_draft = false;
}

static void leave(hel_model *m) { m->depth--; }

void hel_model_launch_begin(hel_model *m) { enter(m); }

void hel_model_launch_end(hel_model *m)
{
	if (m->depth)
		leave(m);
}

static void counted(hel_model *m)
{
	if (!m->have_attn && !m->have_head && !m->have_draft)
		m->counts.launches++;
}

/* The attention projections of every layer. */
static void need_attn(hel_model *m)
{
	if (m->have_attn)
		return;
	counted(m);
	size_t n = (size_t)m->L * SW * m->H;
	derive(m->wq, m->s_wq, 0, n);
	derive(m->wo, m->s_wo, 0, n);
	m->have_attn = true;
}

/* The output head: the rows of the generated tokens. */
static void need_head(hel_model *m)
{
	if (m->have_head)
		return;
	counted(m);
	for (uint32_t g = 0; g < m->G; g++)
		derive(m->wout + (size_t)g * m->H, m->s_wout, (size_t)m->genlist[g] * m->H, m->H);
	m->have_head = true;
}

/* The draft head's narrow output rows. */
static void need_draft(hel_model *m)
{
	if (m->have_draft)
		return;
	for (uint32_t g = 0; g < m->G; g++)
		derive(m->dout + (size_t)g * DRAFT_LANES, m->s_dout,
		       (size_t)m->genlist[g] * DRAFT_LANES, DRAFT_LANES);
	m->have_draft = true;
}

void hel_model_counts_get(const hel_model *m, hel_model_counts *out) { *out = m->counts; }

/* ---- Summaries ------------------------------------------------------------ */

/* Recurrent-state term of word i: bijective in w, so any change counts. */
static inline uint64_t rec_term(uint64_t rsr, uint64_t i, uint64_t w)
{
	return hel_sum_rec_term(rsr, i, w); /* mix64((w ^ rsr) + i * GOLD) */
}

/* The sum of rec_term over the row's recurrent words (model_sum.c: the
 * same formula, vectorized where the CPU allows). */
static uint64_t rec_sum(const hel_model *m, const uint8_t *row, uint64_t rsr)
{
	return hel_sum_rec(row + m->lay.recurrent, m->W, rsr);
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

/* Rank r's term of page id's digest over the planes of one group. */
static uint64_t page_term(const hel_model *m, uint32_t id, uint32_t r, bool draft)
{
	uint64_t s = 0;
	for (uint32_t p = 0; p < m->npl; p++)
		if (m->pl[p].draft == draft)
			s += unit_sum(m, &m->pl[p], pagep(m, r, p, id));
	return mix64(s + comb(m, r, draft ? C_DPAGE : C_PAGE));
}

/* Digest of page id from this process's ranks' planes of one group (with
 * tp, this rank's share; tp_sum adds the others'). */
static uint64_t page_digest(const hel_model *m, uint32_t id, bool draft)
{
	uint64_t d = 0;
	for (uint32_t r = m->lo; r < m->hi; r++)
		d += page_term(m, id, r, draft);
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

/* ---- Creation -------------------------------------------------------------- */

/* Planes: main then drafts, each in name order (the core's order).
 * Returns the largest bytes per token. */
static uint64_t create_planes(hel_model *m)
{
	const hel_core *c = m->core;
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
	return maxtb;
}

static int create_salts(hel_model *m)
{
	const hel_core *c = m->core;
	m->split_salt = calloc(m->R, sizeof *m->split_salt);
	m->comb = calloc((size_t)m->R * COMB_SALTS, sizeof *m->comb);
	m->S_zero = calloc(m->R, sizeof *m->S_zero);
	if (!m->split_salt || !m->comb || !m->S_zero)
		return -ENOMEM;
	m->rep_salt = seed_salt(c, T_REP, 0);
	for (uint32_t r = 0; r < m->R; r++) {
		m->split_salt[r] = seed_salt(c, T_SPLIT, r);
		for (int k = 0; k < COMB_SALTS; k++)
			m->comb[r * COMB_SALTS + k] =
				seed_salt(c, T_COMB, (uint64_t)r * COMB_SALTS + k);
	}
	m->pos_salt = seed_salt(c, T_POS, 0);
	m->dpos_salt = seed_salt(c, T_DPOS, m->mode); /* copy and learned bytes differ */
	m->ind_salt = seed_salt(c, T_IND, 0);
	m->tag_salt = seed_salt(c, T_TAG, 0);
	if (c->has_image)
		m->vis_salt = seed_salt(c, T_VISION, 0);
	m->s_emb = seed_salt(c, T_EMB, 0);
	m->s_wq = seed_salt(c, T_WQ, 0);
	m->s_wo = seed_salt(c, T_WO, 0);
	m->s_wout = seed_salt(c, T_WOUT, 0);
	m->s_demb = seed_salt(c, T_DEMB, 0);
	m->s_dout = seed_salt(c, T_DOUT, 0);
	m->s_cx = seed_salt(c, T_COARSE_X, 0);
	return 0;
}

/* The generated tokens, the initial hidden vectors, the launch's weight
 * buffers and the scratch. */
static int create_weights(hel_model *m)
{
	size_t H = m->H, LW = (size_t)m->L * SW * H;
	m->gen = calloc(m->V, 1);
	m->genlist = malloc((size_t)m->V * sizeof *m->genlist);
	if (!m->gen || !m->genlist)
		return -ENOMEM;
	for (uint32_t v = 0; v < m->V; v++) {
		m->gen[v] = v == '\n' || (v >= 0x20 && v <= 0x7e) || v == HEL_TOK_END;
		if (m->gen[v])
			m->genlist[m->G++] = v;
	}
	m->h0 = malloc(H * 4);
	m->red = malloc((H + 1) * 8);
	m->wq = malloc(LW * 4);
	m->wo = malloc(LW * 4);
	m->wout = malloc((size_t)m->G * H * 4);
	m->z = malloc(H * 4);
	m->hs = malloc(H * 4);
	m->lane = malloc(H * 4);
	m->att = malloc(H * 4);
	m->d = malloc(H * 4);
	m->dhs = malloc(H * 4);
	m->erow = malloc(H * 4);
	m->logits = malloc((size_t)m->V * 4);
	m->rl = malloc((size_t)(HEL_DRAFT_MAX + 1) * m->V * 4);
	m->pv = malloc((size_t)m->G * sizeof *m->pv);
	m->qv = malloc((size_t)HEL_DRAFT_MAX * m->G * sizeof *m->qv);
	if (!m->h0 || !m->red || !m->wq || !m->wo || !m->wout || !m->z || !m->hs || !m->lane ||
	    !m->att || !m->d || !m->dhs || !m->erow || !m->logits || !m->rl || !m->pv || !m->qv)
		return -ENOMEM;
	derive(m->h0, seed_salt(m->core, T_H0, 0), 0, H);
	if (m->spec) {
		m->d0 = malloc(H * 4);
		m->dout = malloc((size_t)m->G * DRAFT_LANES * 4);
		if (!m->d0 || !m->dout)
			return -ENOMEM;
		derive(m->d0, seed_salt(m->core, T_D0, 0), 0, H);
	}
	return 0;
}

/* Zero-chunk hashes, empty partial sums, zero recurrent sums. */
static int create_summaries(hel_model *m, uint64_t maxtb)
{
	uint8_t *zeros = calloc(1, maxtb);
	m->zero_hash = malloc((size_t)m->npl * m->pt * sizeof *m->zero_hash);
	if (!zeros || !m->zero_hash) {
		free(zeros);
		return -ENOMEM;
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
	const hel_core *c = m->core;
	for (uint32_t r = 0; r < m->R; r++) {
		uint64_t rsr = shard_salt(m, c->recurrent_shard, r);
		if (r > 0 && c->recurrent_shard == HEL_SHARD_REPLICATED) {
			m->S_zero[r] = m->S_zero[0];
			continue;
		}
		for (uint64_t i = 0; i < m->W; i++)
			m->S_zero[r] += rec_term(rsr, i, 0);
	}
	return 0;
}

/* The page and row planes, and their summaries. */
static int create_planes_memory(hel_model *m)
{
	m->pbase = calloc((size_t)m->R * m->npl, sizeof *m->pbase);
	m->pmap = calloc(m->npl, sizeof *m->pmap);
	m->rbase = calloc(m->R, sizeof *m->rbase);
	m->ps = calloc(m->pages, sizeof *m->ps);
	m->rs = calloc((size_t)m->rows * m->R, sizeof *m->rs);
	m->row_valid = calloc(m->rows, sizeof *m->row_valid);
	m->arm_page = calloc(m->pages, sizeof *m->arm_page);
	m->arm_row = calloc(m->rows, sizeof *m->arm_row);
	m->pre_page = calloc((size_t)m->pages * m->R, sizeof *m->pre_page);
	m->pre_row = calloc((size_t)m->rows * m->R, sizeof *m->pre_row);
	if (!m->pbase || !m->pmap || !m->rbase || !m->ps || !m->rs || !m->row_valid ||
	    !m->arm_page || !m->arm_row || !m->pre_page || !m->pre_row)
		return eos_fail(-ENOMEM, "model: out of memory");
	for (uint32_t p = 0; p < m->npl; p++)
		m->pmap[p] = (size_t)(m->pl[p].unit * m->pages);
	m->rmap = (size_t)(m->lay.bytes * m->rows);
	for (uint32_t r = m->lo; r < m->hi; r++) {
		for (uint32_t p = 0; p < m->npl; p++)
			if (!(m->pbase[(size_t)r * m->npl + p] = map(m->pmap[p])))
				return eos_fail(
					-ENOMEM,
					"model: cannot map %zu bytes for plane '%s' of rank %u",
					m->pmap[p], m->pl[p].cp->name, r);
		if (!(m->rbase[r] = map(m->rmap)))
			return eos_fail(-ENOMEM,
					"model: cannot map %zu bytes for the rows of rank %u",
					m->rmap, r);
	}
	return 0;
}

int hel_model_create(const hel_core *c, const hel_model_opts *o, hel_model **out)
{
	hel_model *m = NULL;
	int rc;

	*out = NULL;
	if (!hel_core_supports(c, o->mode))
		return eos_fail(-EINVAL, "model: core '%s' does not support the %s state mode",
				c->name, sel_state_mode_name(o->mode));
	if (o->pages == 0 || o->rows == 0 || o->pages == HEL_NO_PAGE)
		return eos_fail(-EINVAL,
				"model: %u pages and %u rows (expected at least one of each)",
				o->pages, o->rows);
	if (o->draft_tokens > HEL_DRAFT_MAX)
		return eos_fail(-EINVAL, "model: %u draft tokens (at most %u)", o->draft_tokens,
				HEL_DRAFT_MAX);
	if (o->tp &&
	    (o->tp->rank >= c->ranks || !o->tp->reduce || (o->tp->rank == 0) != !!o->tp->call))
		return eos_fail(-EINVAL, "model: rank %u of a %u-rank core, or no reduce/call",
				o->tp->rank, c->ranks);
	if (o->tp && o->mode != SEL_MODE_ORDINARY)
		return eos_fail(-EINVAL,
				"model: %s speculation with ranks in separate processes is not "
				"supported (ordinary decoding only)",
				sel_state_mode_name(o->mode));
	if (!(m = calloc(1, sizeof *m)))
		return eos_fail(-ENOMEM, "model: out of memory");
	m->core = c;
	m->mode = o->mode;
	m->spec = o->mode != SEL_MODE_ORDINARY;
	m->R = c->ranks;
	m->lo = o->tp ? o->tp->rank : 0;
	m->hi = o->tp ? o->tp->rank + 1 : c->ranks;
	if (o->tp)
		m->tp = *o->tp;
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
	m->W = m->lay.recurrent_bytes / 8;
	m->T = m->W > 1 ? (m->W - 1) / 2 : 0;
	m->M = m->W > 1 ? m->W - 1 - m->T : 0;
	m->nmain = c->n_planes;
	m->npl = c->n_planes + (m->spec ? c->n_drafts : 0);
	if (!(m->pl = calloc(m->npl, sizeof *m->pl)))
		goto nomem;
	uint64_t maxtb = create_planes(m);
	if (create_salts(m) || create_weights(m) || create_summaries(m, maxtb))
		goto nomem;
	if ((rc = create_planes_memory(m)))
		goto fail;
	if (m->tp.start && (rc = m->tp.start(m->tp.ctx, m)))
		goto fail;
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
					munmap(m->pbase[(size_t)r * m->npl + p],
					       m->pmap[p] ? m->pmap[p] : 1);
	if (m->rbase)
		for (uint32_t r = 0; r < m->R; r++)
			if (m->rbase[r])
				munmap(m->rbase[r], m->rmap ? m->rmap : 1);
	void *own[] = {m->pbase,     m->pmap,      m->rbase,   m->ps,         m->rs,
		       m->row_valid, m->zero_hash, m->S_zero,  m->split_salt, m->comb,
		       m->pl,        m->h0,        m->red,     m->d0,         m->gen,
		       m->genlist,   m->wq,        m->wo,      m->wout,       m->dout,
		       m->z,         m->hs,        m->lane,    m->att,        m->d,
		       m->dhs,       m->erow,      m->logits,  m->rl,         m->pv,
		       m->qv,        m->arm_page,  m->arm_row, m->pre_page,   m->pre_row};
	for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
		free(own[i]);
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

void hel_model_ranks(const hel_model *m, uint32_t *lo, uint32_t *hi)
{
	*lo = m->lo;
	*hi = m->hi;
}

uint8_t *hel_model_page_ptr(hel_model *m, uint32_t rank, uint32_t plane, uint32_t page)
{
	if (rank < m->lo || rank >= m->hi || plane >= m->npl || page >= m->pages)
		return NULL;
	return pagep(m, rank, plane, page);
}

uint8_t *hel_model_row_ptr(hel_model *m, uint32_t rank, uint32_t slot)
{
	if (rank < m->lo || rank >= m->hi || slot >= m->rows)
		return NULL;
	return rowp(m, rank, slot);
}

size_t hel_model_allocations(const hel_model *m, sel_allocation *out, size_t cap)
{
	size_t n = 0;
	for (uint32_t r = m->lo; r < m->hi; r++) {
		for (uint32_t p = 0; p <= m->npl; p++, n++) {
			if (n >= cap)
				continue;
			sel_allocation *a = &out[n];
			a->rank = r - m->lo; /* with tp: a one-rank layout (design 2.14) */
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
	int rc = sel_geometry_build(a, n, m->hi - m->lo, m->pt, out);
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
	int rc;
	if (slot >= m->rows)
		return eos_fail(-EINVAL, "model: row slot %u of %u", slot, m->rows);
	if ((rc = tp_mirror(m, &(hel_tp_call){.op = HEL_TP_ROW_INIT, .slot = slot})))
		return rc;
	m->arm_row[slot] = 0;
	for (uint32_t r = m->lo; r < m->hi; r++) {
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
	int rc = tp_mirror(m, &(hel_tp_call){.op = HEL_TP_ROW_COPY, .slot = src, .arg = dst});
	if (rc)
		return rc;
	m->arm_row[dst] = 0;
	for (uint32_t r = m->lo; r < m->hi; r++) {
		memcpy(rowp(m, r, dst), rowp(m, r, src), m->lay.bytes);
		*rsum(m, dst, r) = *rsum(m, src, r);
	}
	m->row_valid[dst] = true;
	return 0;
}

static int consumed_of(const hel_model *m, uint32_t slot, uint64_t *out)
{
	uint64_t n = rd64(rowp(m, m->lo, slot) + m->lay.consumed);
	for (uint32_t r = m->lo + 1; r < m->hi; r++) {
		uint64_t nr = rd64(rowp(m, r, slot) + m->lay.consumed);
		if (nr != n)
			return eos_fail(
				SEL_ECORRUPT,
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
				return eos_fail(
					SEL_ECORRUPT,
					"model: row slot %u rank %u: partial page of plane '%s' "
					"has a non-zero byte at token %llu (holds %llu tokens)",
					slot, r, m->pl[p].cp->name,
					(unsigned long long)(b / m->pl[p].tb),
					(unsigned long long)tokens);
	}
	return 0;
}

static int row_validate(hel_model *m, uint32_t slot, uint64_t expected, uint64_t arm);

/* With tp every rank validates its own row, and the slot is loaded only
 * when every rank's is: the word is the mask of ranks that refused. */
int hel_model_row_loaded(hel_model *m, uint32_t slot, uint64_t expected)
{
	if (slot >= m->rows)
		return eos_fail(-EINVAL, "model: row slot %u of %u", slot, m->rows);
	int rc = tp_mirror(
		m, &(hel_tp_call){.op = HEL_TP_ROW_LOADED, .slot = slot, .value = expected});
	if (rc)
		return rc;
	m->row_valid[slot] = false;
	uint64_t arm = m->arm_row[slot];
	m->arm_row[slot] = 0;
	rc = row_validate(m, slot, expected, arm);
	if (!m->tp.reduce)
		return rc;
	char own[512];
	snprintf(own, sizeof own, "%s", rc ? eos_errmsg() : "");
	uint64_t refused = rc ? 1ull << m->lo : 0;
	int trc = tp_sum(m, &refused, 1);
	if (trc)
		return trc;
	if (rc)
		return eos_fail(rc, "%s", own);
	if (refused) {
		m->row_valid[slot] = false;
		return eos_fail(SEL_ECORRUPT, "model: row slot %u: rank %u refused the loaded row",
				slot, (unsigned)__builtin_ctzll(refused));
	}
	return 0;
}

/* Rank r's summaries of the row in slot, from its bytes. */
static struct row_sum row_sums(const hel_model *m, uint32_t slot, uint32_t r)
{
	const uint8_t *row = rowp(m, r, slot);
	return (struct row_sum){
		.S = rec_sum(m, row, shard_salt(m, m->core->recurrent_shard, r)),
		.P = partial_sum(m, row, false),
		.DP = m->spec ? partial_sum(m, row, true) : m->DP_empty,
	};
}

/* What the transfer thread computed for rank r's share of a restore armed
 * with seq arm (DESIGN "Landed summaries"), or NULL: compute it here.
 * Debug builds compare it with the bytes (SEL_ECORRUPT in *rc). */
static const struct row_pre *row_landed(hel_model *m, uint32_t slot, uint32_t r, uint64_t arm,
					int *rc)
{
	const struct row_pre *pre = &m->pre_row[(size_t)slot * m->R + r];
	*rc = 0;
	if (!arm || pre->seq != arm)
		return NULL;
#ifdef SEL_DEBUG_CHECKS
	struct row_sum s = row_sums(m, slot, r);
	if (s.S != pre->s.S || s.P != pre->s.P || s.DP != pre->s.DP)
		*rc = eos_fail(SEL_ECORRUPT,
			       "model: row slot %u rank %u: its landed summary differs from its "
			       "bytes (written after it landed)",
			       slot, r);
#endif
	return pre;
}

static int row_validate(hel_model *m, uint32_t slot, uint64_t expected, uint64_t arm)
{
	int rc;
	for (uint32_t r = m->lo; r < m->hi; r++) {
		uint64_t n = rd64(rowp(m, r, slot) + m->lay.consumed);
		if (n != expected)
			return eos_fail(
				SEL_ECORRUPT,
				"model: row slot %u rank %u: consumed count %llu, expected %llu",
				slot, r, (unsigned long long)n, (unsigned long long)expected);
	}
	if (expected > m->core->max_context)
		return eos_fail(SEL_ECORRUPT,
				"model: row slot %u: consumed %llu beyond max_context %llu", slot,
				(unsigned long long)expected,
				(unsigned long long)m->core->max_context);
	for (uint32_t r = m->lo; r < m->hi; r++)
		if ((rc = check_partial_zero(m, slot, r, expected % m->pt)))
			return rc;
	for (uint32_t r = m->lo; r < m->hi; r++) {
		const struct row_pre *pre = row_landed(m, slot, r, arm, &rc);
		if (rc)
			return rc;
		*rsum(m, slot, r) = pre ? pre->s : row_sums(m, slot, r);
		if (pre)
			m->counts.landed_rows++;
		else
			m->counts.computed_rows++;
		if (pre && pre->pieces)
			m->counts.piece_rows++;
	}
	m->row_valid[slot] = true;
	return 0;
}

/* This process's share of page id's digests into *d, *dd: each rank's term
 * as its transfer thread computed it for the restore armed with arm, or
 * from the bytes here (DESIGN "Landed summaries"). */
static int page_local(hel_model *m, uint32_t id, uint64_t arm, uint64_t *d, uint64_t *dd)
{
	*d = *dd = 0;
	for (uint32_t r = m->lo; r < m->hi; r++) {
		const struct page_pre *pre = &m->pre_page[(size_t)id * m->R + r];
		if (arm && pre->seq == arm) {
#ifdef SEL_DEBUG_CHECKS
			if (pre->term != page_term(m, id, r, false) ||
			    (m->spec && pre->dterm != page_term(m, id, r, true)))
				return eos_fail(
					SEL_ECORRUPT,
					"model: page id %u rank %u: its landed summary differs "
					"from its bytes (written after it landed)",
					id, r);
#endif
			*d += pre->term;
			*dd += pre->dterm;
			m->counts.landed_pages++;
			continue;
		}
		*d += page_term(m, id, r, false);
		*dd += m->spec ? page_term(m, id, r, true) : 0;
		m->counts.computed_pages++;
	}
	return 0;
}

int hel_model_page_loaded(hel_model *m, uint32_t page)
{
	if (page >= m->pages)
		return eos_fail(-EINVAL, "model: page id %u of %u", page, m->pages);
	int rc = tp_mirror(m, &(hel_tp_call){.op = HEL_TP_PAGE_LOADED, .slot = page});
	if (rc)
		return rc;
	struct page_sum *ps = &m->ps[page];
	uint64_t arm = m->arm_page[page];
	m->arm_page[page] = 0;
	ps->valid = false;
	if ((rc = page_local(m, page, arm, &ps->local, &ps->dlocal)))
		return rc;
	if (!m->spec)
		ps->dlocal = 0;
	uint64_t d[2] = {ps->local, ps->dlocal};
	if ((rc = tp_sum(m, d, 2)))
		return rc;
	set_page_sum(m, ps, d[0], false);
	if (m->spec)
		set_page_sum(m, ps, d[1], true);
	ps->valid = true;
	return 0;
}

void hel_model_load_expect(hel_model *m, const uint32_t *pages, uint32_t n, uint32_t slot)
{
	uint64_t seq = ++m->load_seq;
	for (uint32_t i = 0; i < n; i++)
		if (pages[i] < m->pages)
			m->arm_page[pages[i]] = seq;
	if (slot < m->rows)
		m->arm_row[slot] = seq;
}

void hel_model_load_cancel(hel_model *m, const uint32_t *pages, uint32_t n, uint32_t slot)
{
	for (uint32_t i = 0; i < n; i++)
		if (pages[i] < m->pages)
			m->arm_page[pages[i]] = 0;
	if (slot < m->rows)
		m->arm_row[slot] = 0;
}

/* On a transfer thread: the restore's destinations are its own until its
 * event, and arm_*, pl, comb and the salts are not written meanwhile. */
void hel_model_landed(void *ctx, uint32_t rank, const uint32_t *pages, uint32_t n, bool row,
		      uint32_t slot)
{
	hel_model *m = ctx;
	uint32_t r = m->lo + rank;
	if (r >= m->hi)
		return;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t id = pages[i];
		uint64_t seq = id < m->pages ? m->arm_page[id] : 0;
		struct page_pre *pre = seq ? &m->pre_page[(size_t)id * m->R + r] : NULL;
		if (!pre || pre->seq == seq) /* unarmed, or hel_model_page_landed's */
			continue;
		pre->term = page_term(m, id, r, false);
		pre->dterm = m->spec ? page_term(m, id, r, true) : 0;
		pre->seq = seq;
	}
	uint64_t seq = row && slot < m->rows ? m->arm_row[slot] : 0;
	if (seq) {
		struct row_pre *pre = &m->pre_row[(size_t)slot * m->R + r];
		const uint8_t *b = rowp(m, r, slot);
		pre->pieces = pre->piece_seq == seq && pre->piece_words == m->W;
		pre->s = (struct row_sum){
			.S = pre->pieces
				     ? pre->piece_S
				     : rec_sum(m, b, shard_salt(m, m->core->recurrent_shard, r)),
			.P = partial_sum(m, b, false),
			.DP = m->spec ? partial_sum(m, b, true) : m->DP_empty,
		};
		pre->piece_seq = 0;
		pre->seq = seq;
	}
}

/* The source of the copy c[0..n) that wrote plane p's unit of page id on
 * rank r, or NULL; *k is where the search starts and, found, where it was
 * (the copies come in plane order, so each search takes one step). */
static const uint8_t *landed_src(const hel_model *m, uint32_t r, uint32_t p, uint32_t id,
				 const sel_landed_copy *c, uint32_t n, uint32_t *k)
{
	const uint8_t *dst = pagep(m, r, p, id);
	for (uint32_t j = 0; j < n; j++, *k = *k + 1 < n ? *k + 1 : 0)
		if (c[*k].dst == dst && c[*k].len == m->pl[p].unit)
			return c[*k].src;
	return NULL;
}

/* On a transfer thread, like hel_model_landed, before its call for the
 * page's window: rank r's terms of page id from the sources its planes
 * were just copied from (in the cache), each found by its destination.
 * Two threads may run it at once for different pages of one restore
 * (transfer.c "Sharing a restore"): it writes only page id's pre_page. */
void hel_model_page_landed(void *ctx, uint32_t rank, uint32_t id, const sel_landed_copy *c,
			   uint32_t n)
{
	hel_model *m = ctx;
	uint32_t r = m->lo + rank;
	if (r >= m->hi || id >= m->pages || !m->arm_page[id])
		return;
	uint64_t s[2] = {0, 0};
	for (uint32_t p = 0, k = 0; p < m->npl; p++) {
		const uint8_t *src = landed_src(m, r, p, id, c, n, &k);
		if (!src)
			return; /* not one copy per plane: hel_model_landed reads the bytes */
		if (m->pl[p].draft && !m->spec)
			continue;
		s[m->pl[p].draft] += unit_sum(m, &m->pl[p], src);
	}
	struct page_pre *pre = &m->pre_page[(size_t)id * m->R + r];
	pre->term = mix64(s[0] + comb(m, r, C_PAGE));
	pre->dterm = m->spec ? mix64(s[1] + comb(m, r, C_DPAGE)) : 0;
	pre->seq = m->arm_page[id];
}

void hel_model_worker_idle(hel_model *m, bool idle)
{
	atomic_store_explicit(&m->idle, idle, memory_order_relaxed);
}

bool hel_model_share(void *model)
{
	hel_model *m = model;
	return atomic_load_explicit(&m->idle, memory_order_relaxed);
}

/* On a transfer thread, like hel_model_landed, before its call for the
 * row: sum the recurrent words that are now whole in [0, off + len), from
 * src where a word lies in the piece (in the cache: the copy just read
 * it), from the row where it straddles the piece's start. */
void hel_model_row_piece(void *ctx, uint32_t rank, uint32_t slot, uint64_t off, uint64_t len,
			 const void *src)
{
	hel_model *m = ctx;
	uint32_t r = m->lo + rank;
	if (r >= m->hi || slot >= m->rows || !m->arm_row[slot])
		return;
	struct row_pre *pre = &m->pre_row[(size_t)slot * m->R + r];
	uint64_t seq = m->arm_row[slot];
	if (off == 0) {
		pre->piece_seq = seq;
		pre->piece_end = pre->piece_words = pre->piece_S = 0;
	}
	if (pre->piece_seq != seq || off != pre->piece_end) {
		pre->piece_seq = 0; /* a gap: hel_model_landed sums the row whole */
		return;
	}
	pre->piece_end = off + len;
	uint64_t rec = m->lay.recurrent, i = pre->piece_words, end = 0;
	uint64_t rsr = shard_salt(m, m->core->recurrent_shard, r);
	const uint8_t *row = rowp(m, r, slot);
	if (pre->piece_end > rec)
		end = (pre->piece_end - rec) / 8 < m->W ? (pre->piece_end - rec) / 8 : m->W;
	for (; i < end && rec + 8 * i < off; i++) /* straddles the start */
		pre->piece_S += hel_sum_rec_at(row + rec + 8 * i, i, 1, rsr);
	if (i < end)
		pre->piece_S += hel_sum_rec_at(src ? (const uint8_t *)src + (rec + 8 * i - off)
						   : row + rec + 8 * i,
					       i, end - i, rsr);
	pre->piece_words = end;
}

int hel_model_check(const hel_model *m)
{
	for (uint32_t id = 0; id < m->pages; id++) {
		const struct page_sum *ps = &m->ps[id];
		if (!ps->valid)
			continue;
		if (page_digest(m, id, false) != ps->local ||
		    (m->spec && page_digest(m, id, true) != ps->dlocal))
			return eos_fail(SEL_ECORRUPT,
					"model check: page id %u changed since it was loaded", id);
	}
	for (uint32_t slot = 0; slot < m->rows; slot++) {
		uint64_t n;
		int rc;
		if (!m->row_valid[slot])
			continue;
		if ((rc = consumed_of(m, slot, &n)))
			return rc;
		for (uint32_t r = m->lo; r < m->hi; r++) {
			const uint8_t *row = rowp(m, r, slot);
			const struct row_sum *s = rsum(m, slot, r);
			if ((rc = check_partial_zero(m, slot, r, n % m->pt)))
				return rc;
			if (s->S != rec_sum(m, row, shard_salt(m, m->core->recurrent_shard, r)))
				return eos_fail(
					SEL_ECORRUPT,
					"model check: row slot %u rank %u: recurrent state changed",
					slot, r);
			if (s->P != partial_sum(m, row, false) ||
			    (m->spec && s->DP != partial_sum(m, row, true)))
				return eos_fail(
					SEL_ECORRUPT,
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
		q[k] = dot(wq + (size_t)k * H, x, H);
		acc[k] = 0;
	}
	uint32_t n = ptab_len(tab);
	for (uint32_t i = 0; i < n; i++) {
		const struct page_sum *ps = &m->ps[ptab_at(tab, i)];
		const uint32_t *kk = draft ? ps->dk : ps->k, *vv = draft ? ps->dv : ps->v;
		uint32_t w = (nl32((i + 1) * GOLD32 + layer + dot(q, kk, SW)) >> 20) | 1;
		for (uint32_t k = 0; k < SW; k++)
			acc[k] += w * vv[k];
	}
	for (uint32_t j = 0; j < H; j++)
		out[j] = n * GOLD32 + dot(wo + (size_t)j * SW, acc, SW);
}

static inline uint32_t ind_tag(const hel_model *m, uint64_t y)
{
	return (uint32_t)mix64(y ^ m->tag_salt) | 1u;
}

/* The induction table is four-way set associative: context y may sit in
 * any of four words, so the small cores' tables rarely lose a context to
 * a collision. */
#define IND_WAYS 4

static inline void ind_slots(const hel_model *m, uint64_t y, uint64_t rsr, uint64_t *slot)
{
	uint64_t h = mix64(y ^ rsr ^ m->ind_salt);
	for (int k = 0; k < IND_WAYS; k++)
		slot[k] = 1 + mix64(h + (uint64_t)k * GOLD) % m->T;
}

static inline void rec_set(uint8_t *w, uint64_t *S, uint64_t rsr, uint64_t i, uint64_t v)
{
	uint64_t old = rd64(w + 8 * i);
	*S += rec_term(rsr, i, v) - rec_term(rsr, i, old);
	wr64(w + 8 * i, v);
}

/* Step 4 for one rank: previous token, induction entry, mixing words. */
/* Word 0 of the recurrent state: the last three consumed tokens, each + 1
 * (0: none) in a 21-bit field, the latest lowest. */
#define CTX_BITS 21
#define CTX_FIELD ((1ull << CTX_BITS) - 1)

static inline uint64_t ctx_push(uint64_t ctx, hel_token x)
{
	return (ctx & ((1ull << 2 * CTX_BITS) - 1)) << CTX_BITS | ((uint64_t)x + 1);
}

/* Step 4 for one rank: the context word, induction entry, mixing words. */
static void rec_update(const hel_model *m, uint8_t *row, struct row_sum *s, uint64_t rsr,
		       hel_token x, uint64_t zd)
{
	uint8_t *w = row + m->lay.recurrent;
	if (m->W == 0)
		return;
	uint64_t prev = rd64(w);
	rec_set(w, &s->S, rsr, 0, ctx_push(prev, x));
	/* x followed the context before it: into the way already holding that
	 * context, else the first empty one, else the one its tag picks. */
	if (m->T && prev) {
		uint64_t ways[IND_WAYS], tag = ind_tag(m, prev), i = 0;
		ind_slots(m, prev, rsr, ways);
		int empty = -1, k;
		for (k = 0; k < IND_WAYS; k++) {
			uint64_t e = rd64(w + 8 * ways[k]);
			if (e >> 32 == tag)
				break;
			if (!e && empty < 0)
				empty = k;
		}
		i = ways[k < IND_WAYS ? k : empty >= 0 ? empty : (int)(tag >> 1 & (IND_WAYS - 1))];
		rec_set(w, &s->S, rsr, i, tag << 32 | x);
	}
	uint32_t u_n = m->M < REC_UPDATES ? (uint32_t)m->M : REC_UPDATES;
	for (uint32_t u = 0; u < u_n; u++) {
		uint64_t h = mix64((zd ^ rsr) + (u + 1) * GOLD);
		uint64_t i = 1 + m->T + h % m->M;
		rec_set(w, &s->S, rsr, i, mix64(rd64(w + 8 * i) ^ h));
	}
}

/* What rank 0's induction table says followed the context ctx (the last
 * three tokens, as word 0 holds them) last time, or NO_TOKEN. */
static hel_token induction(const hel_model *m, uint32_t slot, uint64_t ctx)
{
	if (!m->T)
		return NO_TOKEN;
	uint64_t rsr = shard_salt(m, m->core->recurrent_shard, 0), ways[IND_WAYS];
	const uint8_t *w = rowp(m, m->lo, slot) + m->lay.recurrent;
	uint32_t tag = ind_tag(m, ctx);
	ind_slots(m, ctx, rsr, ways);
	for (int k = 0; k < IND_WAYS; k++) {
		uint64_t e = rd64(w + 8 * ways[k]);
		uint32_t t = (uint32_t)e;
		if ((uint32_t)(e >> 32) == tag)
			return t < m->V && m->gen[t] ? t : NO_TOKEN;
	}
	return NO_TOKEN;
}

/* Write one token's chunk of every plane of one group on every rank into
 * the partial page at position t, and account for it in P or DP. */
static void write_token(hel_model *m, uint32_t slot, uint32_t t, bool draft, const uint32_t *x)
{
	uint64_t xd = XXH3_64bits(x, (size_t)m->H * 4);
	for (uint32_t r = m->lo; r < m->hi; r++) {
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

/* Hidden-vector context of a group: c64 and the all-reduced copies (with
 * tp, this rank's terms, then the sum over the ranks: hs's lanes summed
 * as 64-bit words and cut to 32 bits are the sums modulo 2^32). */
static int main_context(hel_model *m, uint32_t slot, uint64_t n, uint32_t *hs, uint64_t *out)
{
	uint64_t *w = m->red;
	memset(w, 0, ((size_t)m->H + 1) * 8);
	for (uint32_t r = m->lo; r < m->hi; r++) {
		const struct row_sum *s = rsum(m, slot, r);
		const uint8_t *hid = rowp(m, r, slot) + m->lay.hidden;
		w[0] += mix64(s->S + comb(m, r, C_S));
		w[0] += mix64(s->P + comb(m, r, C_P));
		uint32_t wgt = 2 * r + 1;
		for (uint32_t j = 0; j < m->H; j++) {
			uint32_t v;
			memcpy(&v, hid + 4 * (size_t)j, 4);
			w[1 + j] += (uint32_t)(wgt * v);
		}
	}
	int rc = tp_sum(m, w, (size_t)m->H + 1);
	if (rc)
		return rc;
	for (uint32_t j = 0; j < m->H; j++)
		hs[j] = (uint32_t)w[1 + j];
	*out = mix64(n * GOLD + m->pos_salt) + w[0];
	return 0;
}

static uint64_t draft_context(const hel_model *m, uint32_t slot, uint64_t n, uint32_t *dhs)
{
	uint64_t c = mix64(n * GOLD + m->dpos_salt);
	memset(dhs, 0, (size_t)m->H * 4);
	for (uint32_t r = m->lo; r < m->hi; r++) {
		const uint8_t *row = rowp(m, r, slot);
		c += mix64(XXH3_64bits_withSeed(row + m->lay.draft_history,
						m->lay.draft_history_bytes, comb(m, r, C_HISTORY)));
		c += mix64(rsum(m, slot, r)->DP + comb(m, r, C_DP));
		uint32_t wgt = 2 * r + 1;
		for (uint32_t j = 0; j < m->H; j++) {
			uint32_t v;
			memcpy(&v, row + m->lay.draft_hidden + 4 * (size_t)j, 4);
			dhs[j] += wgt * v;
		}
	}
	return c;
}

static int check_table(const hel_model *m, uint32_t slot, const struct ptab *tab, uint64_t *n_out)
{
	uint64_t n;
	int rc;
	if (slot >= m->rows || !m->row_valid[slot])
		return eos_fail(-EINVAL, "model: row slot %u holds no sequence (init or load it)",
				slot);
	if ((rc = consumed_of(m, slot, &n)))
		return rc;
	uint32_t np = ptab_len(tab);
	if (np != n / m->pt)
		return eos_fail(
			SEL_ECORRUPT,
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

/* Step 7, the output head, for one position: z its hidden vector, x the
 * token it consumed (has_x false: a core without recurrent state, whose
 * row does not keep it, so the logits cannot use it either), ind what
 * followed x's context last time or NO_TOKEN, c the tokens consumed. */
static void head(hel_model *m, const uint32_t *z, hel_token x, bool has_x, uint64_t c,
		 hel_token ind, int32_t *logits)
{
	need_head(m);
	m->counts.heads++;
	const uint32_t H = m->H;
	uint64_t hx = has_x ? coarse_position(m, x, c) : 0;
	for (uint32_t v = 0; v < m->V; v++)
		logits[v] = HEL_LOGIT_MASKED;
	for (uint32_t g = 0; g < m->G; g++) {
		uint32_t acc = dot(m->wout + (size_t)g * H, z, H);
		int32_t l = (int32_t)(acc >> FINE_SHIFT) - (1 << (31 - FINE_SHIFT));
		if (has_x)
			l += coarse(hx, m->genlist[g]);
		logits[m->genlist[g]] = l;
	}
	if (ind != NO_TOKEN)
		logits[ind] += INDUCTION_BONUS;
}

/* Steps 1-6 for token x: consume it into slot (embed: NULL for a
 * vocabulary token; at an image-token position, x being HEL_TOK_IMAGE,
 * that position's image-token state, added to the embedding).  *ind_out
 * (may be NULL) receives the induction table's answer for x after the
 * update, for step 7. */
static int consume(hel_model *m, uint32_t slot, const struct ptab *tab, hel_token x,
		   uint32_t next_page, bool *page_done, const uint32_t *embed, hel_token *ind_out)
{
	const uint32_t H = m->H;
	uint32_t *z = m->z, *lane = m->lane, *att = m->att, *e = m->erow;
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
		return eos_fail(-E2BIG, "model: row slot %u is full (max_context %llu tokens)",
				slot, (unsigned long long)m->core->max_context);
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
	need_attn(m);
	m->counts.positions++;

	/* 1-2: context and embedding. */
	uint64_t c;
	if ((rc = main_context(m, slot, n, m->hs, &c)))
		return rc;
	lanes(c, lane, H);
	derive(e, m->s_emb, (size_t)x * H, H);
	for (uint32_t j = 0; j < H; j++)
		z[j] = nl32(e[j] + (embed ? embed[j] : 0) + rotl32(m->hs[j], 5) + lane[j]);
	/* 3: attention blocks. */
	for (uint32_t l = 0; l < m->L; l++) {
		attend(m, tab, m->wq + (size_t)l * SW * H, m->wo + (size_t)l * SW * H, z, false, l,
		       att);
		for (uint32_t j = 0; j < H; j++)
			z[j] = nl32(z[j] + att[j] + l);
	}
	/* 4: recurrent update and its output. */
	uint64_t zd = XXH3_64bits(z, (size_t)H * 4), rec = 0;
	for (uint32_t r = m->lo; r < m->hi; r++) {
		struct row_sum *s = rsum(m, slot, r);
		rec_update(m, rowp(m, r, slot), s, shard_salt(m, m->core->recurrent_shard, r), x,
			   zd);
		rec += mix64(s->S + comb(m, r, C_REC));
	}
	if ((rc = tp_sum(m, &rec, 1)))
		return rc;
	lanes(rec ^ zd, lane, H);
	for (uint32_t j = 0; j < H; j++)
		z[j] = nl32(z[j] ^ lane[j]);
	/* 5: the new hidden and the token's bytes. */
	for (uint32_t r = m->lo; r < m->hi; r++)
		memcpy(rowp(m, r, slot) + m->lay.hidden, z, (size_t)H * 4);
	write_token(m, slot, t, false, z);
	/* 6: draft state. */
	if (m->spec) {
		uint32_t *d = m->d;
		uint64_t dc = draft_context(m, slot, n, m->dhs);
		lanes(dc, lane, H);
		derive(e, m->s_demb, (size_t)x * H, H);
		for (uint32_t j = 0; j < H; j++)
			d[j] = nl32(e[j] + rotl32(m->dhs[j], 3) + lane[j] + rotl32(z[j], 11));
		for (uint32_t r = m->lo; r < m->hi; r++) {
			uint8_t *row = rowp(m, r, slot);
			memcpy(row + m->lay.draft_hidden, d, (size_t)H * 4);
			uint32_t tok = x;
			memcpy(row + m->lay.draft_history + 4 * (n % m->Hd), &tok, 4);
		}
		write_token(m, slot, t, true, d);
	}
	for (uint32_t r = m->lo; r < m->hi; r++)
		wr64(rowp(m, r, slot) + m->lay.consumed, n + 1);
	/* A completed page moves to next_page on every plane and rank. */
	if (completes) {
		struct page_sum *ps = &m->ps[next_page];
		uint64_t dig = 0, ddig = 0;
		for (uint32_t r = m->lo; r < m->hi; r++) {
			uint8_t *row = rowp(m, r, slot);
			struct row_sum *s = rsum(m, slot, r);
			for (uint32_t p = 0; p < m->npl; p++) {
				memcpy(pagep(m, r, p, next_page), row + m->pl[p].part,
				       m->pl[p].unit);
				memset(row + m->pl[p].part, 0, m->pl[p].unit);
			}
			dig += mix64(s->P + comb(m, r, C_PAGE));
			ddig += mix64(s->DP + comb(m, r, C_DPAGE));
			s->P = m->P_empty;
			s->DP = m->DP_empty;
		}
		ps->valid = false;
		m->arm_page[next_page] = 0; /* the model's own bytes now */
		ps->local = dig;
		ps->dlocal = m->spec ? ddig : 0;
		uint64_t d[2] = {dig, ddig};
		if ((rc = tp_sum(m, d, 2)))
			return rc;
		dig = d[0];
		ddig = d[1];
		set_page_sum(m, ps, dig, false);
		if (m->spec)
			set_page_sum(m, ps, ddig, true);
		ps->valid = true;
	}
	if (page_done)
		*page_done = completes;
	if (ind_out)
		*ind_out = m->W ? induction(m, slot, rd64(rowp(m, m->lo, slot) + m->lay.recurrent))
				: NO_TOKEN;
	return 0;
}

/* Consume x, then (logits non-NULL) step 7 for the position after it. */
static int step(hel_model *m, uint32_t slot, const struct ptab *tab, hel_token x,
		uint32_t next_page, int32_t *logits, bool *page_done, const uint32_t *embed)
{
	hel_token ind = NO_TOKEN;
	int rc = consume(m, slot, tab, x, next_page, page_done, embed, logits ? &ind : NULL);
	if (rc == 0 && logits)
		head(m, m->z, x, m->W > 0, rd64(rowp(m, m->lo, slot) + m->lay.consumed), ind,
		     logits);
	return rc;
}

int hel_model_step(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		   hel_token token, uint32_t next_page, int32_t *logits)
{
	struct ptab tab = {pages, n_pages, HEL_NO_PAGE};
	int rc = tp_logits(m, logits);
	if (rc || (rc = tp_mirror(m, &(hel_tp_call){.op = HEL_TP_STEP,
						    .slot = slot,
						    .pages = pages,
						    .n_pages = n_pages,
						    .value = token,
						    .arg = next_page})))
		return rc;
	enter(m);
	rc = step(m, slot, &tab, token, next_page, logits, NULL, NULL);
	leave(m);
	return rc;
}

/* A prefill chunk of n positions: tokens[i], or (tokens NULL) image-token
 * positions with states[i x hidden ..) added to HEL_TOK_IMAGE. */
static int prefill(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		   const hel_token *tokens, const uint32_t *states, size_t n, int32_t *logits)
{
	uint64_t c;
	int rc;
	if (slot >= m->rows || !m->row_valid[slot])
		return eos_fail(-EINVAL, "model: row slot %u holds no sequence (init or load it)",
				slot);
	if ((rc = consumed_of(m, slot, &c)))
		return rc;
	if (n == 0 && logits)
		return eos_fail(-EINVAL, "model: logits of an empty chunk");
	if (n_pages != (c + n) / m->pt)
		return eos_fail(
			-EINVAL,
			"model: a chunk of %zu tokens after %llu needs a page table of %llu "
			"pages, not %u",
			n, (unsigned long long)c, (unsigned long long)((c + n) / m->pt), n_pages);
	if ((rc = tp_logits(m, logits)))
		return rc;
	hel_tp_call call = {.op = tokens ? HEL_TP_PREFILL : HEL_TP_PREFILL_IMAGE,
			    .slot = slot,
			    .pages = pages,
			    .n_pages = n_pages,
			    .words = tokens ? tokens : states,
			    .n_words = tokens ? n : n * m->H,
			    .n = n};
	if ((rc = tp_mirror(m, &call)))
		return rc;
	enter(m);
	for (size_t i = 0; i < n && rc == 0; i++) {
		uint64_t pos = c + i;
		struct ptab tab = {pages, (uint32_t)(pos / m->pt), HEL_NO_PAGE};
		uint32_t next = pos % m->pt == m->pt - 1 ? pages[pos / m->pt] : HEL_NO_PAGE;
		rc = step(m, slot, &tab, tokens ? tokens[i] : HEL_TOK_IMAGE, next,
			  i + 1 == n ? logits : NULL, NULL, tokens ? NULL : states + i * m->H);
	}
	leave(m);
	return rc;
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
	const sel_input_tensor *pt =
		&prepared->h.tensors[sel_input_find(prepared, HEL_VISION_PIXELS)];
	const sel_input_tensor *gt =
		&prepared->h.tensors[sel_input_find(prepared, HEL_VISION_GRID)];
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
		return eos_fail(-EINVAL,
				"model: core '%s' has no [image] section: it takes no images",
				m->core->name);
	if (n && !states)
		return eos_fail(-EINVAL, "model: image positions without their states");
	return prefill(m, slot, pages, n_pages, NULL, states, n, logits);
}

int hel_model_logits(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		     int32_t *logits)
{
	struct ptab tab = {pages, n_pages, HEL_NO_PAGE};
	uint64_t n;
	int rc;
	if ((rc = check_table(m, slot, &tab, &n)))
		return rc;
	if (n == 0)
		return eos_fail(-EINVAL, "model: row slot %u holds no token to take logits after",
				slot);
	/* Step 5 wrote z to every rank's hidden region and step 7 projected
	 * that same z: read it back, insisting the replicas agree. */
	const uint8_t *h0 = rowp(m, m->lo, slot) + m->lay.hidden;
	for (uint32_t r = m->lo + 1; r < m->hi; r++)
		if (memcmp(rowp(m, r, slot) + m->lay.hidden, h0, m->lay.hidden_bytes))
			return eos_fail(
				SEL_ECORRUPT,
				"model: row slot %u: rank %u's hidden vector differs from rank 0's",
				slot, r);
	/* Word 0 of the recurrent state holds the last consumed tokens: the
	 * one whose coarse factors step 7 used, and the context whose
	 * induction entry it consulted (after its update). */
	hel_token x = 0, ind = NO_TOKEN;
	if (m->W) {
		uint64_t w0 = rd64(rowp(m, m->lo, slot) + m->lay.recurrent);
		uint64_t f0 = w0 & CTX_FIELD, f1 = w0 >> CTX_BITS & CTX_FIELD,
			 f2 = w0 >> 2 * CTX_BITS & CTX_FIELD;
		if (f0 == 0 || f0 > m->V || f1 > m->V || f2 > m->V || w0 >> 3 * CTX_BITS ||
		    (f1 == 0 && f2 != 0))
			return eos_fail(
				SEL_ECORRUPT,
				"model: row slot %u: the context word %#llx holds no tokens", slot,
				(unsigned long long)w0);
		x = (hel_token)(f0 - 1);
		ind = induction(m, slot, w0);
	}
	memcpy(m->z, h0, (size_t)m->H * 4);
	enter(m);
	head(m, m->z, x, m->W > 0, n, ind, logits);
	leave(m);
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
	double u =
		(double)(mix64(s->seed ^ mix64(position * GOLD + 0x5a3d)) >> 11) * 0x1p-53 * total;
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

/* The draw deciding `purpose` at a position, in [0, 1): a function of the
 * seed and the position only, like hel_sample's (D_SAMPLE). */
static double draw(const hel_sampler *s, uint64_t position, uint64_t purpose)
{
	return (double)(mix64(s->seed ^ mix64(position * GOLD + purpose)) >> 11) * 0x1p-53;
}

/* p[g]: the softmax of logits at temperature over the generated tokens, in
 * id order (masked tokens have none), as hel_sample draws from it. */
static void probs(const hel_model *m, const int32_t *l, double temperature, double *p)
{
	int32_t best = HEL_LOGIT_MASKED;
	for (uint32_t g = 0; g < m->G; g++)
		if (l[m->genlist[g]] > best)
			best = l[m->genlist[g]];
	double scale = 1.0 / (temperature * HEL_LOGIT_SCALE), total = 0;
	for (uint32_t g = 0; g < m->G; g++) {
		int32_t v = l[m->genlist[g]];
		p[g] = v > HEL_LOGIT_MASKED ? exp((double)(v - best) * scale) : 0;
		total += p[g];
	}
	for (uint32_t g = 0; g < m->G; g++)
		p[g] /= total;
}

/* The index drawn from weights w[0..n) (not necessarily normalised) by u. */
static uint32_t pick(const double *w, uint32_t n, double u)
{
	double total = 0, cum = 0;
	uint32_t last = 0;
	for (uint32_t g = 0; g < n; g++)
		if (w[g] > 0) {
			total += w[g];
			last = g;
		}
	u *= total;
	for (uint32_t g = 0; g < n; g++) {
		cum += w[g];
		if (w[g] > 0 && u < cum)
			return g;
	}
	return last;
}

/* Token at sequence position pos in a draft history ring of Hd tokens. */
static inline hel_token ring_at(const uint8_t *ring, uint32_t Hd, uint64_t pos)
{
	uint32_t v;
	memcpy(&v, ring + 4 * (pos % Hd), 4);
	return v;
}

/* A draft in progress: the history (ring positions lo..n-1) followed by
 * the proposals so far. */
struct draft {
	const uint8_t *ring;
	uint64_t n, lo;
	uint64_t dc, digest;
	uint32_t dd[DRAFT_LANES]; /* the draft head's state */
	hel_token props[HEL_DRAFT_MAX];
	uint32_t pg[HEL_DRAFT_MAX]; /* sampled proposals: their generated-token index */
	uint32_t np;
};

static inline hel_token draft_at(const hel_model *m, const struct draft *d, uint64_t q)
{
	return q < d->n ? ring_at(d->ring, m->Hd, q) : d->props[q - d->n];
}

/* The draft head's state after the slot's consumed tokens: the draft
 * hidden plus attention over the draft planes, and the context hash. */
static int draft_begin(hel_model *m, uint32_t slot, const struct ptab *tab, struct draft *d)
{
	uint64_t n;
	int rc;
	if (!m->spec)
		return eos_fail(-EINVAL, "model: drafts need a speculative state mode");
	if ((rc = check_table(m, slot, tab, &n)))
		return rc;
	if (n == 0)
		return eos_fail(-EINVAL, "model: row slot %u holds no token to draft after", slot);
	need_draft(m);
	d->ring = rowp(m, m->lo, slot) + m->lay.draft_history;
	d->n = n;
	d->lo = n > m->Hd ? n - m->Hd : 0;
	d->np = 0;
	d->dc = draft_context(m, slot, n, m->dhs);
	/* Fold the draft hidden into SW lanes, attend over the draft planes'
	 * page summaries with it, and keep DRAFT_LANES lanes of both. */
	uint32_t f[SW], acc[SW] = {0};
	for (uint32_t k = 0; k < SW; k++) {
		f[k] = 0;
		for (uint32_t i = 0; i < m->H / SW; i++)
			f[k] += m->dhs[i * SW + k] * (2 * i + 1);
	}
	uint32_t np = ptab_len(tab);
	for (uint32_t i = 0; i < np; i++) {
		const struct page_sum *ps = &m->ps[ptab_at(tab, i)];
		uint32_t w = (nl32((i + 1) * GOLD32 + 1 + dot(f, ps->dk, SW)) >> 20) | 1;
		for (uint32_t k = 0; k < SW; k++)
			acc[k] += w * ps->dv[k];
	}
	uint32_t lane[DRAFT_LANES];
	lanes(d->dc, lane, DRAFT_LANES);
	for (uint32_t j = 0; j < DRAFT_LANES; j++)
		d->dd[j] = nl32((f[j] ^ rotl32(f[j + DRAFT_LANES], 7)) + acc[j] +
				rotl32(acc[j + DRAFT_LANES], 13) + lane[j] + np * GOLD32);
	d->digest = XXH3_64bits_withSeed(d->dd, sizeof d->dd, d->dc) | 1;
	return 0;
}

/* The draft's view of the induction table: what followed the context of
 * its last three tokens (the slot's context word, pushed on through the
 * proposals) last time.  Like a draft head reading the main model's
 * features, it reads the main model's table in the row. */
static hel_token draft_successor(const hel_model *m, uint32_t slot, const struct draft *d)
{
	uint64_t ctx = rd64(rowp(m, m->lo, slot) + m->lay.recurrent);
	for (uint32_t i = 0; i < d->np; i++)
		ctx = ctx_push(ctx, d->props[i]);
	return induction(m, slot, ctx);
}

/* The draft head's logits for the next proposal: step 7 truncated (DESIGN
 * "Drafts"), its state chained through the last token. */
static void draft_logits(hel_model *m, uint32_t slot, struct draft *d, int32_t *out)
{
	hel_token cur = draft_at(m, d, d->n + d->np - 1);
	uint32_t lane[DRAFT_LANES], e[DRAFT_LANES];
	lanes(d->dc + (d->np + 1) * GOLD, lane, DRAFT_LANES);
	derive(e, m->s_demb, (size_t)(cur < m->V ? cur : 0) * DRAFT_LANES, DRAFT_LANES);
	for (uint32_t j = 0; j < DRAFT_LANES; j++)
		d->dd[j] = nl32(d->dd[j] + e[j] + lane[j]);
	uint64_t hx = coarse_position(m, cur, d->n + d->np);
	for (uint32_t v = 0; v < m->V; v++)
		out[v] = HEL_LOGIT_MASKED;
	for (uint32_t g = 0; g < m->G; g++) {
		uint32_t acc = dot(m->dout + (size_t)g * DRAFT_LANES, d->dd, DRAFT_LANES);
		int32_t l = (int32_t)(acc >> DRAFT_SHIFT) - (1 << (31 - DRAFT_SHIFT));
		if (m->W)
			l += coarse(hx, m->genlist[g]);
		out[m->genlist[g]] = l;
	}
	hel_token b = m->T ? draft_successor(m, slot, d) : NO_TOKEN;
	if (b != NO_TOKEN)
		out[b] += INDUCTION_BONUS;
}

/* Copy mode: the continuation of the longest earlier match (up to
 * COPY_MATCH_MAX tokens; the latest of the longest) of the history's last
 * tokens, read on past the history's end through the proposals themselves
 * (a periodic continuation), up to max tokens and the first one the model
 * never generates.  0 when nothing matches. */
static uint32_t copy_propose(hel_model *m, struct draft *d, uint32_t max)
{
	uint64_t n = d->n, lo = d->lo, best_p = 0;
	uint32_t best = 0;
	for (uint64_t p = n - 1; p-- > lo && best < COPY_MATCH_MAX;) {
		uint32_t l = 0;
		while (l < COPY_MATCH_MAX && p >= lo + l &&
		       ring_at(d->ring, m->Hd, p - l) == ring_at(d->ring, m->Hd, n - 1 - l))
			l++;
		if (l > best) {
			best = l;
			best_p = p;
		}
	}
	for (uint32_t k = 0; best >= COPY_MATCH_MIN && k < max; k++) {
		hel_token t = draft_at(m, d, best_p + 1 + k);
		if (t >= m->V || !m->gen[t])
			break;
		d->props[d->np++] = t;
	}
	return d->np;
}

/* Up to max proposals after the slot's consumed tokens into d: copy's, or
 * the draft head's (greedy; sampled from q at s's temperature when s is
 * hot, q stored in m->qv).  *copied: they came from the history. */
static int propose(hel_model *m, uint32_t slot, const struct ptab *tab, const hel_sampler *s,
		   uint32_t max, struct draft *d, bool *copied)
{
	int rc;
	*copied = false;
	if ((rc = draft_begin(m, slot, tab, d)))
		return rc;
	if (max > HEL_DRAFT_MAX)
		max = HEL_DRAFT_MAX;
	if (m->mode == SEL_MODE_COPY && copy_propose(m, d, max)) {
		*copied = true;
		m->counts.proposals += d->np;
		return 0;
	}
	bool hot = m->mode == SEL_MODE_LEARNED && s && s->temperature > 0;
	while (d->np < max) {
		draft_logits(m, slot, d, m->logits);
		hel_token t;
		if (hot) {
			double *q = m->qv + (size_t)d->np * m->G;
			probs(m, m->logits, s->temperature, q);
			uint32_t g = pick(q, m->G, draw(s, d->n + d->np, D_DRAFT));
			d->pg[d->np] = g;
			t = m->genlist[g];
		} else {
			t = argmax(m->logits, m->V);
		}
		d->props[d->np++] = t;
	}
	m->counts.proposals += d->np;
	return 0;
}

int hel_model_propose(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		      hel_token *out, uint32_t max)
{
	struct ptab tab = {pages, n_pages, HEL_NO_PAGE};
	struct draft d;
	bool copied;
	if (max == 0)
		return 0;
	enter(m);
	int rc = propose(m, slot, &tab, NULL, max, &d, &copied);
	leave(m);
	if (rc)
		return rc;
	memcpy(out, d.props, d.np * sizeof *out);
	return (int)d.np;
}

/* ---- Verification ------------------------------------------------------------------ */

/* Decide proposal i of d at position pos against the main logits l there:
 * returns the token to emit, *ok whether it is the proposal accepted. */
static hel_token decide(hel_model *m, const struct draft *d, uint32_t i, bool sampled,
			const hel_sampler *s, const int32_t *l, uint64_t pos, bool *ok)
{
	hel_token want = d->props[i];
	if (!sampled) {
		/* Greedy, or a point-mass draft: min(1, p(d)/1) and the residual
		 * max(0, p - 1_d) are the ordinary draw itself. */
		hel_token t = hel_sample(l, m->V, s, pos);
		*ok = t == want;
		return t;
	}
	double *p = m->pv;
	const double *q = m->qv + (size_t)i * m->G;
	uint32_t g = d->pg[i];
	probs(m, l, s->temperature, p);
	if (draw(s, pos, D_ACCEPT) * q[g] < p[g]) {
		*ok = true;
		return want;
	}
	*ok = false;
	for (uint32_t k = 0; k < m->G; k++)
		p[k] = p[k] > q[k] ? p[k] - q[k] : 0; /* the residual */
	return m->genlist[pick(p, m->G, draw(s, pos, D_RESIDUAL))];
}

/* The round of hel_model_decode, inside its launch. */
static int decode_round(hel_model *m, uint32_t slot, struct ptab *tab, uint32_t next_page,
			hel_token pending, const hel_decode_opts *o, uint32_t max, hel_round *out)
{
	const hel_sampler *s = o->sampler;
	int32_t *L = m->rl;
	uint64_t n;
	bool done;
	int rc;

	if ((rc = step(m, slot, tab, pending, next_page, L, &done, NULL)))
		return rc;
	if (done) {
		out->page_used = true;
		tab->extra = next_page;
	}
	if ((rc = consumed_of(m, slot, &n)))
		return rc;
	uint32_t K = m->spec ? (o->draft_tokens ? o->draft_tokens : m->K) : 0;
	uint32_t k = K < max - 1 ? K : max - 1;
	struct draft d = {.np = 0};
	if (k && (rc = propose(m, slot, tab, s, k, &d, &out->copied)))
		return rc;
	memcpy(out->proposed, d.props, d.np * sizeof *d.props);
	out->n_proposed = d.np;
	out->draft_state = k ? d.digest : 0;
	bool sampled = m->mode == SEL_MODE_LEARNED && !out->copied && s && s->temperature > 0;
	for (uint32_t i = 0;; i++) {
		const int32_t *l = L + (size_t)i * m->V;
		uint64_t pos = n + i;
		bool ok = false;
		hel_token t = i < d.np ? decide(m, &d, i, sampled, s, l, pos, &ok)
				       : hel_sample(l, m->V, s, pos); /* the token after them all */
		out->tokens[out->n_tokens] = t;
		out->logits[out->n_tokens++] = l;
		if (!ok)
			return 0; /* a correction, or the last: not consumed */
		out->accepted++;
		/* Accepted: consumed, unless it ends the round or would complete
		 * a page (DESIGN "Rounds"). */
		if ((o->stop_on_end && t == HEL_TOK_END) || out->n_tokens >= max ||
		    pos % m->pt == m->pt - 1 || pos >= m->core->max_context)
			return 0;
		if ((rc = step(m, slot, tab, t, HEL_NO_PAGE, L + (size_t)(i + 1) * m->V, NULL,
			       NULL)))
			return rc;
	}
}

int hel_model_decode(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		     uint32_t next_page, hel_token pending, const hel_decode_opts *o,
		     hel_round *out)
{
	struct ptab tab = {pages, n_pages, HEL_NO_PAGE};
	memset(out, 0, sizeof *out);
	if (!o || o->max_tokens == 0)
		return eos_fail(-EINVAL, "model: a decode round of zero tokens");
	if (o->draft_tokens > HEL_DRAFT_MAX)
		return eos_fail(-EINVAL, "model: %u draft tokens (at most %u)", o->draft_tokens,
				HEL_DRAFT_MAX);
	uint32_t max = o->max_tokens < HEL_DRAFT_MAX + 1 ? o->max_tokens : HEL_DRAFT_MAX + 1;
	/* With tp the mode is ordinary: the peers consume pending, as a step. */
	int rc = tp_logits(m, m->rl);
	if (rc || (rc = tp_mirror(m, &(hel_tp_call){.op = HEL_TP_STEP,
						    .slot = slot,
						    .pages = pages,
						    .n_pages = n_pages,
						    .value = pending,
						    .arg = next_page})))
		return rc;
	enter(m);
	rc = decode_round(m, slot, &tab, next_page, pending, o, max, out);
	leave(m);
	return rc;
}

/* ---- Ranks in separate processes: a peer runs what rank 0 mirrored ----------- */

int hel_model_tp_run(hel_model *m, const hel_tp_call *c)
{
	if (!m->tp.reduce || m->tp.call)
		return eos_fail(-EINVAL, "model: only a peer rank runs mirrored calls");
	switch (c->op) {
	case HEL_TP_ROW_INIT: return hel_model_row_init(m, c->slot);
	case HEL_TP_ROW_COPY: return hel_model_row_copy(m, c->slot, c->arg);
	case HEL_TP_ROW_LOADED: return hel_model_row_loaded(m, c->slot, c->value);
	case HEL_TP_PAGE_LOADED: return hel_model_page_loaded(m, c->slot);
	case HEL_TP_STEP:
		if (c->value > UINT32_MAX)
			return eos_fail(-EINVAL, "model: token %llu", (unsigned long long)c->value);
		return hel_model_step(m, c->slot, c->pages, c->n_pages, (hel_token)c->value, c->arg,
				      NULL);
	case HEL_TP_PREFILL:
		if (c->n_words != c->n)
			return eos_fail(-EINVAL, "model: a chunk of %zu tokens with %zu words",
					c->n, c->n_words);
		return hel_model_prefill(m, c->slot, c->pages, c->n_pages, c->words, c->n, NULL);
	case HEL_TP_PREFILL_IMAGE:
		if (c->n_words != c->n * m->H)
			return eos_fail(-EINVAL, "model: %zu image positions with %zu state words",
					c->n, c->n_words);
		return hel_model_prefill_image(m, c->slot, c->pages, c->n_pages, c->words, c->n,
					       NULL);
	}
	return eos_fail(-EINVAL, "model: mirrored call %d", (int)c->op);
}
