/*
 * input_cache.c - the in-memory tier of reusable CPU input records
 * (design 2.13, "CPU records use ordinary host memory. Active leases remain
 * charged until their last owner releases them"; design 1, one eighth of
 * the warm budget).  See input_cache.h for the contract.
 *
 * DESIGN
 *   One hash map of entries keyed by (kind, key) -- the keys are BLAKE2b
 *   outputs, so their first bytes are the hash -- and one LRU list holding
 *   exactly the retained entries that are ready and unleased, least
 *   recently used first.  An entry is in one of three states: PENDING (an
 *   owner is preparing it; in the map so later lookups wait on it rather
 *   than prepare again), READY (holds a record) or FAILED (off the map;
 *   kept only until its waiters release it).  A READY entry is retained
 *   (in the map, charged) or not (off the map, uncharged, freed with its
 *   last lease).
 *   Waiting is by polling or by a condition variable; publish and fail
 *   broadcast it and call the notify hook outside the lock, so a worker
 *   that sleeps on an eventfd learns to poll again.
 *   The lock covers only map and list operations: records are built and
 *   freed outside it (a record freed by eviction is freed after unlock).
 *
 * INVARIANTS (sel_input_cache_check)
 *   1. bytes = sum of charges of retained entries <= budget.
 *   2. The LRU list holds exactly the retained READY entries with refs 0.
 *   3. Every entry in the map is PENDING or retained READY, with a unique
 *      (kind, key); entries = retained READY count; pending = PENDING count.
 *   4. A PENDING entry has refs >= 1 (its owner).
 */
#include "input_cache.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "eos.h"
#include "internal.h"

enum {
	PENDING,
	READY,
	FAILED
};

struct sel_input_lease {
	struct sel_input_lease *hnext;       /* hash chain */
	struct sel_input_lease *prev, *next; /* LRU */
	uint32_t kind;
	sel_input_key key;
	int state;
	int err;       /* FAILED */
	uint32_t refs; /* leases */
	bool in_map;
	uint64_t charge; /* while retained */
	sel_input_rec rec;
};

struct lru {
	struct sel_input_lease *head, *tail;
	uint32_t n;
};

struct sel_input_cache {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	uint64_t budget;
	struct sel_input_lease **buckets;
	size_t nbuckets, in_map;
	struct lru lru;
	void (*notify)(void *);
	void *notify_ctx;
	struct sel_input_cache_stats st;
};

#include "list.h"
EOS_DLIST_DEFINE(lru, struct lru, struct sel_input_lease)

uint64_t sel_input_budget(uint64_t warm_bytes, bool vision)
{
	return vision ? warm_bytes / 8 / 4096 * 4096 : 0;
}

static size_t bucket_of(const sel_input_cache *c, uint32_t kind, const sel_input_key *k)
{
	return (size_t)((sel_get_u64(k->b) ^ kind) & (c->nbuckets - 1));
}

int sel_input_cache_create(uint64_t budget, sel_input_cache **out)
{
	sel_input_cache *c = calloc(1, sizeof *c);
	*out = NULL;
	if (!c)
		return eos_fail(-ENOMEM, "input cache: out of memory");
	c->budget = budget;
	c->st.budget = budget;
	c->nbuckets = 64;
	c->buckets = calloc(c->nbuckets, sizeof(struct sel_input_lease *));
	if (!c->buckets) {
		free(c);
		return eos_fail(-ENOMEM, "input cache: out of memory");
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_condattr_destroy(&ca);
	*out = c;
	return 0;
}

static void entry_free(struct sel_input_lease *e)
{
	sel_input_rec_free(&e->rec);
	free(e);
}

void sel_input_cache_destroy(sel_input_cache *c)
{
	if (!c)
		return;
	for (size_t b = 0; b < c->nbuckets; b++)
		for (struct sel_input_lease *e = c->buckets[b], *n; e; e = n) {
			n = e->hnext;
			entry_free(e);
		}
	free(c->buckets);
	pthread_cond_destroy(&c->cv);
	pthread_mutex_destroy(&c->mu);
	free(c);
}

void sel_input_cache_notify(sel_input_cache *c, void (*fn)(void *ctx), void *ctx)
{
	pthread_mutex_lock(&c->mu);
	c->notify = fn;
	c->notify_ctx = ctx;
	pthread_mutex_unlock(&c->mu);
}

/* ---- Map (under the lock) ------------------------------------------------ */

static struct sel_input_lease *find(const sel_input_cache *c, uint32_t kind, const sel_input_key *k)
{
	for (struct sel_input_lease *e = c->buckets[bucket_of(c, kind, k)]; e; e = e->hnext)
		if (e->kind == kind && sel_input_key_eq(&e->key, k))
			return e;
	return NULL;
}

static void map_del(sel_input_cache *c, struct sel_input_lease *e)
{
	struct sel_input_lease **p = &c->buckets[bucket_of(c, e->kind, &e->key)];
	while (*p != e)
		p = &(*p)->hnext;
	*p = e->hnext;
	e->hnext = NULL;
	e->in_map = false;
	c->in_map--;
}

/* Grow the table when it is twice as full as it has buckets; failure to
 * grow only lengthens chains. */
static void map_add(sel_input_cache *c, struct sel_input_lease *e)
{
	if (c->in_map + 1 > 2 * c->nbuckets) {
		size_t nb = c->nbuckets * 2;
		struct sel_input_lease **b = calloc(nb, sizeof(struct sel_input_lease *));
		if (b) {
			size_t old = c->nbuckets;
			struct sel_input_lease **ob = c->buckets;
			c->buckets = b;
			c->nbuckets = nb;
			for (size_t i = 0; i < old; i++)
				for (struct sel_input_lease *x = ob[i], *n; x; x = n) {
					n = x->hnext;
					size_t k = bucket_of(c, x->kind, &x->key);
					x->hnext = b[k];
					b[k] = x;
				}
			free(ob);
		}
	}
	size_t k = bucket_of(c, e->kind, &e->key);
	e->hnext = c->buckets[k];
	c->buckets[k] = e;
	e->in_map = true;
	c->in_map++;
}

/* Drop a retained READY entry from the map (eviction or replacement):
 * uncharge it; the caller frees it when it has no lease. */
static void unretain(sel_input_cache *c, struct sel_input_lease *e)
{
	map_del(c, e);
	c->st.bytes -= e->charge;
	c->st.entries--;
	e->charge = 0;
}

/* Make room for need bytes by evicting unleased entries, oldest first;
 * evicted entries go on *freed for the caller to free after unlocking.
 * Whether need now fits. */
static bool make_room(sel_input_cache *c, uint64_t need, struct sel_input_lease **freed)
{
	if (need > c->budget)
		return false;
	while (c->st.bytes + need > c->budget && c->lru.head) {
		struct sel_input_lease *v = c->lru.head;
		lru_del(&c->lru, v);
		unretain(c, v);
		c->st.evictions++;
		v->hnext = *freed;
		*freed = v;
	}
	return c->st.bytes + need <= c->budget;
}

static void free_list(struct sel_input_lease *e)
{
	for (struct sel_input_lease *n; e; e = n) {
		n = e->hnext;
		entry_free(e);
	}
}

/* ---- Calls ----------------------------------------------------------------- */

int sel_input_cache_lookup(sel_input_cache *c, uint32_t kind, const sel_input_key *key,
			   sel_input_lease **out)
{
	*out = NULL;
	pthread_mutex_lock(&c->mu);
	c->st.lookups++;
	struct sel_input_lease *e = find(c, kind, key);
	if (e) {
		if (e->state == READY && e->refs == 0)
			lru_del(&c->lru, e);
		if (e->state == READY && e->refs == 0)
			c->st.leased++;
		e->refs++;
		int rc = e->state == READY ? SEL_INPUT_HIT : SEL_INPUT_WAIT;
		if (rc == SEL_INPUT_HIT)
			c->st.hits++;
		else
			c->st.waits++;
		pthread_mutex_unlock(&c->mu);
		*out = e;
		return rc;
	}
	e = calloc(1, sizeof *e);
	if (!e) {
		pthread_mutex_unlock(&c->mu);
		return eos_fail(-ENOMEM, "input cache: out of memory");
	}
	e->kind = kind;
	e->key = *key;
	e->state = PENDING;
	e->refs = 1;
	map_add(c, e);
	c->st.misses++;
	c->st.pending++;
	pthread_mutex_unlock(&c->mu);
	*out = e;
	return SEL_INPUT_MISS;
}

static void notify(sel_input_cache *c)
{
	pthread_mutex_lock(&c->mu);
	void (*fn)(void *) = c->notify;
	void *ctx = c->notify_ctx;
	pthread_mutex_unlock(&c->mu);
	if (fn)
		fn(ctx);
}

void sel_input_cache_fail(sel_input_cache *c, sel_input_lease *e, int err)
{
	pthread_mutex_lock(&c->mu);
	if (e->state == PENDING) {
		map_del(c, e);
		e->state = FAILED;
		e->err = err < 0 ? err : -EIO;
		c->st.pending--;
		c->st.failed++;
		pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	notify(c);
	sel_input_cache_release(c, e);
}

int sel_input_cache_publish(sel_input_cache *c, sel_input_lease *e, sel_input_rec *rec)
{
	if (!rec->bytes || rec->len != rec->h.file_bytes || rec->h.kind != e->kind ||
	    !sel_input_key_eq(&rec->h.key, &e->key) || e->state != PENDING) {
		int rc = eos_fail(-EINVAL, "input cache: publishing a record that is not the one "
					   "the entry waits for");
		sel_input_rec_free(rec);
		pthread_mutex_lock(&c->mu);
		e->refs++; /* fail releases one lease; the owner keeps its own */
		pthread_mutex_unlock(&c->mu);
		sel_input_cache_fail(c, e, rc);
		return rc;
	}
	struct sel_input_lease *freed = NULL;
	uint64_t charge = rec->len + SEL_INPUT_ENTRY_OVERHEAD;
	pthread_mutex_lock(&c->mu);
	e->rec = *rec;
	memset(rec, 0, sizeof *rec);
	__atomic_store_n(&e->state, READY, __ATOMIC_RELEASE); /* the record before READY */
	c->st.pending--;
	c->st.published++;
	if (make_room(c, charge, &freed)) {
		e->charge = charge;
		c->st.bytes += charge;
		c->st.entries++;
		c->st.leased++; /* the owner's lease, at least */
	} else {
		map_del(c, e);
		c->st.not_retained++;
	}
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	free_list(freed);
	notify(c);
	return 0;
}

int sel_input_cache_put(sel_input_cache *c, sel_input_rec *rec)
{
	if (!rec->bytes || rec->len != rec->h.file_bytes) {
		sel_input_rec_free(rec);
		return eos_fail(-EINVAL, "input cache: put of an unsealed record");
	}
	struct sel_input_lease *e = calloc(1, sizeof *e), *freed = NULL;
	if (!e) {
		sel_input_rec_free(rec);
		return eos_fail(-ENOMEM, "input cache: out of memory");
	}
	uint64_t charge = rec->len + SEL_INPUT_ENTRY_OVERHEAD;
	pthread_mutex_lock(&c->mu);
	if (find(c, rec->h.kind, &rec->h.key) || !make_room(c, charge, &freed)) {
		pthread_mutex_unlock(&c->mu);
		free(e);
		sel_input_rec_free(rec);
		free_list(freed);
		return 0;
	}
	e->kind = rec->h.kind;
	e->key = rec->h.key;
	e->state = READY;
	e->rec = *rec;
	memset(rec, 0, sizeof *rec);
	e->charge = charge;
	map_add(c, e);
	lru_push(&c->lru, e);
	c->st.bytes += charge;
	c->st.entries++;
	c->st.published++;
	pthread_mutex_unlock(&c->mu);
	free_list(freed);
	return 0;
}

int sel_input_cache_poll(sel_input_cache *c, sel_input_lease *e)
{
	pthread_mutex_lock(&c->mu);
	int rc = e->state == READY ? 0 : e->state == PENDING ? -EAGAIN : e->err;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int sel_input_cache_wait(sel_input_cache *c, sel_input_lease *e, uint64_t timeout_ns)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + timeout_ns;
	ts.tv_sec = (time_t)(t / 1000000000ull);
	ts.tv_nsec = (long)(t % 1000000000ull);
	pthread_mutex_lock(&c->mu);
	while (e->state == PENDING)
		if (pthread_cond_timedwait(&c->cv, &c->mu, &ts) == ETIMEDOUT && e->state == PENDING)
			break;
	int rc = e->state == READY ? 0 : e->state == PENDING ? -ETIMEDOUT : e->err;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

const sel_input_rec *sel_input_lease_rec(const sel_input_lease *e)
{
	/* READY is final and stored (release) after the record is in place,
	 * so this needs no lock. */
	return e && __atomic_load_n(&e->state, __ATOMIC_ACQUIRE) == READY ? &e->rec : NULL;
}

void sel_input_cache_release(sel_input_cache *c, sel_input_lease *e)
{
	if (!e)
		return;
	bool drop = false;
	pthread_mutex_lock(&c->mu);
	if (--e->refs == 0) {
		if (e->in_map && e->state == READY) {
			lru_push(&c->lru, e);
			c->st.leased--;
		} else if (!e->in_map) {
			drop = true;
		}
	}
	pthread_mutex_unlock(&c->mu);
	if (drop)
		entry_free(e);
}

sel_input_lease *sel_input_cache_ref(sel_input_cache *c, sel_input_lease *e)
{
	pthread_mutex_lock(&c->mu);
	e->refs++; /* it holds one already, so it is off the LRU list */
	pthread_mutex_unlock(&c->mu);
	return e;
}

void sel_input_cache_stats(sel_input_cache *c, struct sel_input_cache_stats *out)
{
	pthread_mutex_lock(&c->mu);
	*out = c->st;
	pthread_mutex_unlock(&c->mu);
}

int sel_input_cache_check(sel_input_cache *c)
{
	int rc = 0;
	pthread_mutex_lock(&c->mu);
	uint64_t bytes = 0, ready = 0, pending = 0, leased = 0, unleased = 0, n = 0;
	for (size_t b = 0; b < c->nbuckets && !rc; b++)
		for (struct sel_input_lease *e = c->buckets[b]; e && !rc; e = e->hnext) {
			n++;
			if (!e->in_map || bucket_of(c, e->kind, &e->key) != b)
				rc = eos_fail(SEL_ECORRUPT,
					      "input cache check: an entry in the wrong bucket");
			else if (e->state == PENDING) {
				pending++;
				if (e->refs < 1)
					rc = eos_fail(SEL_ECORRUPT,
						      "input cache check: a pending entry "
						      "without its owner");
			} else if (e->state == READY) {
				ready++;
				bytes += e->charge;
				if (e->charge != e->rec.len + SEL_INPUT_ENTRY_OVERHEAD)
					rc = eos_fail(SEL_ECORRUPT,
						      "input cache check: a charge that is "
						      "not the record's");
				if (e->refs)
					leased++;
				else
					unleased++;
			} else {
				rc = eos_fail(SEL_ECORRUPT,
					      "input cache check: a failed entry in the map");
			}
			for (struct sel_input_lease *f = e->hnext; f && !rc; f = f->hnext)
				if (f->kind == e->kind && sel_input_key_eq(&f->key, &e->key))
					rc = eos_fail(SEL_ECORRUPT,
						      "input cache check: a key twice");
		}
	uint64_t in_lru = 0;
	for (struct sel_input_lease *e = c->lru.head; e && !rc; e = e->next) {
		in_lru++;
		if (!e->in_map || e->state != READY || e->refs)
			rc = eos_fail(SEL_ECORRUPT,
				      "input cache check: the LRU list holds a leased, "
				      "pending or dropped entry");
	}
	if (!rc && (n != c->in_map || in_lru != c->lru.n || in_lru != unleased))
		rc = eos_fail(SEL_ECORRUPT,
			      "input cache check: %llu entries in the map (%zu counted), "
			      "%llu in the LRU list of %u, %llu unleased",
			      (unsigned long long)n, c->in_map, (unsigned long long)in_lru,
			      c->lru.n, (unsigned long long)unleased);
	if (!rc && (bytes != c->st.bytes || ready != c->st.entries || pending != c->st.pending ||
		    leased != c->st.leased))
		rc = eos_fail(SEL_ECORRUPT,
			      "input cache check: counted %llu bytes, %llu entries, "
			      "%llu pending, %llu leased; stats say %llu, %llu, %llu, %llu",
			      (unsigned long long)bytes, (unsigned long long)ready,
			      (unsigned long long)pending, (unsigned long long)leased,
			      (unsigned long long)c->st.bytes, (unsigned long long)c->st.entries,
			      (unsigned long long)c->st.pending, (unsigned long long)c->st.leased);
	if (!rc && c->st.bytes > c->budget)
		rc = eos_fail(SEL_ECORRUPT, "input cache check: %llu bytes over the budget of %llu",
			      (unsigned long long)c->st.bytes, (unsigned long long)c->budget);
	pthread_mutex_unlock(&c->mu);
	return rc;
}
