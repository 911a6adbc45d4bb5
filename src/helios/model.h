/*
 * model.h - the synthetic model Helios serves (ARCHITECTURE.md "The
 * reference engine's model"; design 2.1).
 *
 * A small integer "transformer" whose weights derive from the core's seed.
 * Its cache lives where a real engine's does and is laid out as the core
 * says: for each rank one page plane per core plane (KV_PAGES, indexed by
 * physical page id) and one row plane (STATE_ROWS, indexed by state slot).
 * Every stored byte feeds the next token's logits (draft bytes feed the
 * draft proposals), so a wrong, stale or misplaced byte changes the output.
 * Speculative modes decode in rounds (hel_model_decode): a draft proposes,
 * the model verifies in the same launch, the output is the model's own.
 *
 * The engine owns page ids and state slots; the model never allocates them.
 * A sequence is a state slot plus its page table: the ids of its complete
 * pages in order.  Its partial tail page lives in the row.
 *
 * Threads: a model is used by one thread (the model worker).  Other threads
 * (the store's transfer threads) may read and write page and row bytes
 * through the addresses of hel_model_allocations() while the worker runs,
 * as long as no step reads the ids and slots they touch.
 *
 * Loading rule: after anything other than the model writes a page id or a
 * row slot (a restore), call hel_model_page_loaded() for each page id and
 * hel_model_row_loaded() for the slot before a step uses them.  The model
 * keeps per-page and per-row summaries derived from all their bytes; these
 * calls recompute them (and validate the row), a step refuses a page or
 * slot that was never loaded.
 */
#ifndef HEL_MODEL_H
#define HEL_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"
#include "input_record.h"
#include "selene.h"

#define HEL_DRAFT_MAX 16 /* proposals per speculative round */
#define HEL_DRAFT_DEFAULT 4
#define HEL_SUMMARY_LANES 16          /* width of a page summary (key and value) */
#define HEL_LOGIT_SCALE 1024          /* logit units per nat */
#define HEL_LOGIT_MASKED (-(1 << 30)) /* tokens the model never generates */
#define HEL_NO_PAGE UINT32_MAX

typedef struct hel_model hel_model;

/* ---- Ranks in separate processes (design 2.8, 2.14; src/helios/ranks.h) ----
 *
 * With opts.tp a model holds one rank of its core: that rank's page planes
 * and rows only.  Every computing call then runs on every rank in the same
 * order: rank 0's model mirrors each call to the peers (tp.call, before it
 * runs it), a peer runs what it receives (hel_model_tp_run), and inside
 * the kernel each rank combines its share with the others' through
 * tp.reduce -- a sum, modulo 2^64, of a few words, at the points where the
 * one-process model sums over its ranks (the tensor-parallel all-reduce).
 * Tokens are then bit-identical to the same core in one process.  Logits
 * come from rank 0 only.  Ordinary mode only (speculative modes are refused). */
typedef enum hel_tp_op {
	HEL_TP_ROW_INIT = 1,  /* slot */
	HEL_TP_ROW_COPY,      /* slot -> arg */
	HEL_TP_ROW_LOADED,    /* slot, value = expected consumed */
	HEL_TP_PAGE_LOADED,   /* slot = the page id */
	HEL_TP_STEP,          /* slot, pages, value = token, arg = next page */
	HEL_TP_PREFILL,       /* slot, pages, words = n tokens */
	HEL_TP_PREFILL_IMAGE, /* slot, pages, words = n x hidden states */
	HEL_TP_OP_MAX = HEL_TP_PREFILL_IMAGE,
} hel_tp_op;

typedef struct hel_tp_call {
	hel_tp_op op;
	uint32_t slot, arg;
	uint64_t value;
	const uint32_t *pages;
	uint32_t n_pages;
	const uint32_t *words; /* PREFILL: tokens; PREFILL_IMAGE: states */
	size_t n_words;
	size_t n; /* PREFILL*: positions */
} hel_tp_call;

typedef struct hel_model_tp {
	uint32_t rank; /* the rank this process holds, < core->ranks */
	/* Sum words[0..n) over every rank, in place.  The same calls in the
	 * same order on every rank.  0, or an error that stops the model. */
	int (*reduce)(void *ctx, uint64_t *words, size_t n);
	/* Rank 0: send the call to every peer (NULL on a peer). */
	int (*call)(void *ctx, const hel_tp_call *c);
	/* Rank 0, optional: called once by hel_model_create with the model
	 * made (the peers make theirs); its failure fails the create. */
	int (*start)(void *ctx, hel_model *m);
	void *ctx;
} hel_model_tp;

typedef struct hel_model_opts {
	sel_state_mode mode;    /* one of the core's state_modes */
	uint32_t pages;         /* page ids 0..pages-1 (the page planes' count) */
	uint32_t rows;          /* state slots 0..rows-1 (the row plane's count) */
	uint32_t draft_tokens;  /* proposals per round, speculative modes: 1..16 (0: 4) */
	const hel_model_tp *tp; /* NULL: every rank in this process (copied) */
} hel_model_opts;

/* Create a model over core (which must outlive it): weights from the seed,
 * the page and row planes as host memory (page-aligned, zeroed).  Every
 * row slot starts uninitialised (hel_model_row_init). */
int hel_model_create(const hel_core *core, const hel_model_opts *opts, hel_model **out);
/* NULL-safe; frees the planes. */
void hel_model_destroy(hel_model *m);

const hel_core *hel_model_core(const hel_model *m);
sel_state_mode hel_model_mode(const hel_model *m);
/* The row layout in this model's mode (the same on every rank). */
const hel_row_layout *hel_model_layout(const hel_model *m);
uint32_t hel_model_page_count(const hel_model *m);
uint32_t hel_model_row_count(const hel_model *m);

/* ---- The cache planes (design 2.1) --------------------------------------- */

/* Active page planes: the core's planes, then (speculative modes) its draft
 * planes, each group in name order.  plane indexes below refer to this. */
uint32_t hel_model_plane_count(const hel_model *m);
const hel_core_plane *hel_model_plane(const hel_model *m, uint32_t plane);
/* Direct addresses (tests, tools, the host transfer backend). */
uint8_t *hel_model_page_ptr(hel_model *m, uint32_t rank, uint32_t plane, uint32_t page);
uint8_t *hel_model_row_ptr(hel_model *m, uint32_t rank, uint32_t slot);

/* The model's runtime-sized allocations: per rank one KV_PAGES allocation
 * per active plane (unit = page_tokens x token_bytes, count = pages) and
 * one STATE_ROWS allocation "row" (unit = layout bytes, count = rows), all
 * SEL_MEM_HOST.  Writes up to cap entries, returns how many there are. */
size_t hel_model_allocations(const hel_model *m, sel_allocation *out, size_t cap);
/* sel_geometry_build() over those allocations. */
int hel_model_geometry(const hel_model *m, sel_geometry **out);
/* sel_offload_identity(core identity, mode): the store's namespace. */
void hel_model_offload_identity(const hel_model *m, uint8_t out[SEL_IDENTITY_BYTES]);

/* ---- Rows and pages ------------------------------------------------------- */

/* An empty sequence in slot (every rank). */
int hel_model_row_init(hel_model *m, uint32_t slot);
/* A peer: run a call rank 0 mirrored (hel_model_tp.call), without logits. */
int hel_model_tp_run(hel_model *m, const hel_tp_call *c);
/* The ranks this model holds: [*lo, *hi). */
void hel_model_ranks(const hel_model *m, uint32_t *lo, uint32_t *hi);

/* Snapshot or restore between slots: dst becomes a copy of src on every
 * rank, summaries included (no reload needed). */
int hel_model_row_copy(hel_model *m, uint32_t src, uint32_t dst);
/* The slot's bytes were written from outside (a restore): validate them
 * and recompute the slot's summaries.  Fails with SEL_ECORRUPT, naming the
 * rank, when any rank's consumed count differs from expected_consumed or
 * the partial page is not canonical (bytes past the consumed tokens must be
 * zero); the slot is then unusable until re-initialised or reloaded. */
int hel_model_row_loaded(hel_model *m, uint32_t slot, uint64_t expected_consumed);
/* The slot's consumed count (SEL_ECORRUPT when ranks disagree). */
int hel_model_row_consumed(const hel_model *m, uint32_t slot, uint64_t *out);
/* Page id's bytes were written from outside: recompute its summary from
 * every byte of every plane of every rank. */
int hel_model_page_loaded(hel_model *m, uint32_t page);
/* Landed summaries (model.c DESIGN "Landed summaries"; issue 18).  A
 * restore into pages[0..n) and slot may have its summaries computed on
 * the store's transfer threads as its windows land, so that page_loaded
 * and row_loaded only take them.  hel_model_load_expect, on the worker
 * before the fetch starts, arms those ids for one restore;
 * hel_model_landed (a sel_landed_hook's fn, ctx the model) is called by a
 * transfer thread after rank's window of destinations landed and computes
 * that rank's summaries of the armed ids among them; page_loaded and
 * row_loaded disarm and use a rank's landed summary only if it was
 * computed for the armed restore, else compute it from the bytes as
 * without a hook.  hel_model_load_cancel disarms (a failed restore).  Any
 * write the model makes to an id disarms it too. */
void hel_model_load_expect(hel_model *m, const uint32_t *pages, uint32_t n, uint32_t slot);
void hel_model_load_cancel(hel_model *m, const uint32_t *pages, uint32_t n, uint32_t slot);
void hel_model_landed(void *model, uint32_t rank, const uint32_t *pages, uint32_t n, bool row,
		      uint32_t slot);
/* A sel_landed_hook's row_piece: sums the recurrent words of rank's share
 * of slot's row in [0, off + len) that the earlier pieces did not, from
 * src (the piece's source, still in the cache; NULL: the row itself);
 * hel_model_landed's row call then takes that sum if every piece of the
 * armed restore came, in order, and sums the row from its bytes
 * otherwise. */
void hel_model_row_piece(void *model, uint32_t rank, uint32_t slot, uint64_t off, uint64_t len,
			 const void *src);
/* A sel_landed_hook's page: rank's terms of page's digests from the
 * sources of its copies (one per plane, found by destination; otherwise
 * nothing, and hel_model_landed reads the page), which hel_model_landed
 * then keeps. */
void hel_model_page_landed(void *model, uint32_t rank, uint32_t page, const sel_landed_copy *copies,
			   uint32_t n);
/* The worker's CPU is free (idle true: it is about to wait) or not; a
 * sel_landed_hook's share says so to the transfer threads, which then copy
 * a restore on two threads (selene transfer.c "Sharing a restore"). */
void hel_model_worker_idle(hel_model *m, bool idle);
bool hel_model_share(void *model);
/* Checker (STYLE 9): recompute every summary of every loaded page and row
 * and compare.  0, or SEL_ECORRUPT naming the first mismatch (bytes changed
 * behind the model's back).  Cost: all bytes; for tests and debug builds. */
int hel_model_check(const hel_model *m);

/* ---- Computing ------------------------------------------------------------ */

/* The per-token kernel shared by prefill and decode.  Consume token in
 * slot, whose complete pages are pages[0..n_pages) (n_pages must equal
 * consumed / page_tokens, else SEL_ECORRUPT).  The token's bytes of every
 * plane go to the row's partial page; when it completes the page they are
 * copied to page id next_page on every plane and rank (next_page is
 * ignored otherwise).  logits (vocab entries, may be NULL to skip the
 * output projection) receive the next token's logits in units of
 * 1/HEL_LOGIT_SCALE nat, HEL_LOGIT_MASKED for tokens never generated. */
int hel_model_step(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		   hel_token token, uint32_t next_page, int32_t *logits);

/* Consume n tokens (a prefill chunk).  pages is the page table after the
 * chunk: (consumed + n) / page_tokens ids, whose entries past the current
 * complete pages receive the pages the chunk completes.  logits: of the
 * last token (may be NULL).  Chunking never changes the result. */
int hel_model_prefill(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		      const hel_token *tokens, size_t n, int32_t *logits);

/* The logits the step that brought slot to its state produced: the output
 * head over its last hidden vector, its last consumed token and the
 * induction entry of its last three (the context word of the recurrent
 * state), bit-identical to that step's logits, computed from the row alone
 * and consuming nothing.  A request restored at the very end of
 * its prompt samples from these (design 2.7 "a full-prompt hit resumes").
 * pages[0..n_pages) is the slot's page table, validated as for a step (the
 * logits do not read it).  -EINVAL for an empty sequence or an unloaded
 * slot; SEL_ECORRUPT when the ranks' copies of the hidden vector differ. */
int hel_model_logits(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		     int32_t *logits);

/* ---- Vision cores (an [image] section; docs/inputs.md) --------------------- */

/* The vision path: the image-token states of a prepared image (vision.h),
 * H lanes per image token into states[0 .. tokens x hidden).  Every byte
 * of both tensors feeds every token's state.  Returns the token count, or
 * -EINVAL when the record does not fit the core (hel_vision_check).
 * Reads nothing of the model's cache; any thread. */
int hel_model_image_states(const hel_model *m, const sel_input_rec *prepared, uint32_t *states);

/* Consume n image-token positions, like hel_model_prefill with the token
 * HEL_TOK_IMAGE at each position and states[i x hidden ..) added to its
 * embedding (the i-th of the chunk; a chunked image passes each chunk's
 * share of its states).  The positions then feed every later token like
 * any other: their bytes go to the pages and the row.  Chunking never
 * changes the result.  -EINVAL on a text-only core.  (A plain step or
 * prefill of HEL_TOK_IMAGE on a vision core is refused.) */
int hel_model_prefill_image(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
			    const uint32_t *states, size_t n, int32_t *logits);

typedef struct hel_sampler {
	double temperature; /* 0: greedy */
	uint64_t
		seed; /* temperature sampling: the draw at a position is fixed by (seed, position) */
} hel_sampler;

/* Sample from logits: greedy (lowest id among equal maxima) or softmax at
 * temperature with a draw determined by seed and position (the index the
 * sampled token will have in the sequence). */
hel_token hel_sample(const int32_t *logits, uint32_t vocab, const hel_sampler *s,
		     uint64_t position);

/* A sampled token's log probability under the model, and the most likely
 * alternatives (the OpenAI API's logprobs and top_logprobs). */
#define HEL_TOP_LOGPROBS_MAX 20
typedef struct hel_logprob {
	float logprob;                       /* natural log; -INFINITY if masked */
	uint32_t n_top;                      /* entries below */
	hel_token top[HEL_TOP_LOGPROBS_MAX]; /* most likely first, ties by lower id */
	float top_logprob[HEL_TOP_LOGPROBS_MAX];
} hel_logprob;

/* token's log probability in the softmax of logits at temperature 1 (the
 * model's own distribution, whatever temperature sampled it: vLLM's raw
 * logprobs) and the top most likely tokens (top <= HEL_TOP_LOGPROBS_MAX;
 * masked tokens never appear).  Pure. */
void hel_logprobs(const int32_t *logits, uint32_t vocab, hel_token token, uint32_t top,
		  hel_logprob *out);

/* ---- Launches (the cost model: design 4, docs/performance.md) -------------- */

/* A launch is one pass of the model over the positions it computes, the
 * unit a GPU engine submits per step.  The model keeps no weight matrices:
 * a launch derives from the seed, once, every weight it multiplies by (the
 * attention projections, the output head's rows, the draft head), the
 * stand-in for a GPU reading its weights from memory, which the positions
 * of one launch share; each position then pays only its own arithmetic.
 * Every call below that computes is a launch of its own, unless it runs
 * between launch_begin and launch_end (nestable), which make one launch of
 * everything between them -- the engine brackets each step with them, as a
 * GPU engine runs all requests of a step in one forward pass.  Results
 * never depend on how calls are grouped into launches. */
void hel_model_launch_begin(hel_model *m);
void hel_model_launch_end(hel_model *m);

typedef struct hel_model_counts {
	uint64_t launches;  /* launches that derived weights */
	uint64_t positions; /* tokens consumed */
	uint64_t heads;     /* logits computed (output head positions) */
	uint64_t proposals; /* draft proposals made */
	/* Loads (page_loaded, row_loaded), per rank share: summaries a
	 * transfer thread computed as the bytes landed, and those computed
	 * from the bytes by the call itself. */
	uint64_t landed_pages, computed_pages;
	uint64_t landed_rows, computed_rows;
	/* landed_rows whose recurrent summary was summed piece by piece
	 * (hel_model_row_piece). */
	uint64_t piece_rows;
} hel_model_counts;
void hel_model_counts_get(const hel_model *m, hel_model_counts *out);

/* ---- Decode rounds (speculative decoding) ----------------------------------- */

typedef struct hel_decode_opts {
	const hel_sampler *sampler; /* NULL: greedy */
	uint32_t max_tokens;        /* tokens the round may emit, >= 1 (the request's
				       max_tokens less what it generated) */
	bool stop_on_end;           /* an emitted HEL_TOK_END ends the round (and the
				       request); false: ignore_eos, END is a token */
	uint32_t draft_tokens;      /* proposals, 1..HEL_DRAFT_MAX; 0: the model's */
} hel_decode_opts;

/* One decode round. */
typedef struct hel_round {
	hel_token tokens[HEL_DRAFT_MAX + 1]; /* emitted; the last one is not consumed */
	uint32_t n_tokens;
	/* The main model's logits each emitted token was decided from (at
	 * its position; temperature 1 gives the target distribution's
	 * logprobs).  Valid until the model's next call. */
	const int32_t *logits[HEL_DRAFT_MAX + 1];
	hel_token proposed[HEL_DRAFT_MAX]; /* the draft's proposals (speculative) */
	uint32_t n_proposed;
	uint32_t accepted; /* proposals verified and emitted */
	bool copied;       /* copy mode: proposals from the history
						(false: the draft head's fallback) */
	/* A digest of the draft state the round's proposals started from
	 * (draft history, draft hidden, draft partial page, the draft planes'
	 * summaries of the page table, the context word): tests compare it to
	 * see draft bytes matter.  0 without proposals. */
	uint64_t draft_state;
	bool page_used; /* next_page received a completed page */
} hel_round;

/* Consume pending (the last emitted token, not yet consumed) and emit.
 * Ordinary mode emits one token, sampled from the logits after pending.
 * Speculative modes draft up to draft_tokens proposals for the positions
 * after pending (copy: the longest earlier match of the latest tokens in
 * the row's draft history, else the draft head; learned: the draft head)
 * and verify them in the same launch, position by position: a proposal is
 * accepted as the main model's own choice would be (temperature 0: it is
 * the greedy token; sampling: standard speculative sampling -- accept with
 * min(1, p/q), else emit a token from the normalised max(0, p - q), q a
 * point mass for copy proposals), and the round emits the accepted prefix
 * plus the main model's token after it.  Every emitted token except the
 * last is consumed, so the state afterwards is exactly that of ordinary
 * decoding of the same tokens, and a rejected proposal is never consumed.
 * The round ends early, its last emitted token unconsumed, at END
 * (stop_on_end), at max_tokens, or where consuming an accepted proposal
 * would complete a page (only pending completes one: it goes to
 * next_page).  Temperature 0 emits the ordinary tokens; sampling emits
 * tokens from the target distribution (copy mode: the ordinary tokens, as
 * its acceptance test is the ordinary draw itself). */
int hel_model_decode(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		     uint32_t next_page, hel_token pending, const hel_decode_opts *o,
		     hel_round *out);

/* Speculative modes: up to max greedy proposals to follow the slot's
 * consumed tokens, from its draft state (the draft history, draft hidden,
 * draft partial page and the draft planes of the pages in the table);
 * what hel_model_decode would propose at temperature 0.  Changes nothing.
 * Returns the count or a negative error. */
int hel_model_propose(hel_model *m, uint32_t slot, const uint32_t *pages, uint32_t n_pages,
		      hel_token *out, uint32_t max);

#endif
