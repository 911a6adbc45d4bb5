/*
 * recutil.h - helpers shared by the record, disk and scan tests and the
 * disk benchmark: hand-built geometries, record namespaces, keys and
 * payload patterns.
 */
#ifndef RECUTIL_H
#define RECUTIL_H

#include "record.h"
#include "testutil.h"

#define TG_MAX_RANKS 8
#define TG_MAX_PLANES 128

/* A geometry built by hand (addresses and counts are irrelevant to
 * records).  Plane names are "p000", "p001", ... so geometry order is index
 * order. */
struct test_geo {
	sel_geometry g;
	sel_rank_geometry rank[TG_MAX_RANKS];
	sel_plane planes[TG_MAX_RANKS][TG_MAX_PLANES];
	char names[TG_MAX_RANKS][TG_MAX_PLANES][16];
};

/* ranks ranks, each with n planes of units[] and a row of row_bytes. */
void test_geo_init(struct test_geo *t, uint32_t ranks, uint32_t page_tokens, uint32_t n,
		   const uint64_t *units, uint64_t row_bytes);
/* Replace rank r's planes and row. */
void test_geo_rank(struct test_geo *t, uint32_t r, uint32_t n, const uint64_t *units,
		   uint64_t row_bytes);

/* A namespace for g with the offload identity of model identity byte `model`
 * (all 32 bytes equal), ordinary mode. */
void test_ns_init(sel_record_ns *ns, const sel_geometry *g, uint8_t model);

/* A random key of consumed tokens. */
void test_key(test_rng *r, uint64_t consumed, sel_key *k);

/* A record desc: key at c tokens, parent (NULL or a key), tail derived
 * (linked) or the full chain (full == true or no parent). */
void test_desc(test_rng *r, uint32_t page_tokens, uint64_t c, const sel_key *parent, bool full,
	       sel_record_desc *d);

/* Temporary record files (sel_record_is_tmp_name) in directory dir. */
int test_count_tmp(const char *dir);
/* XOR the byte at off of the file at path with 0x5a (a corruption). */
void test_flip_byte(const char *path, uint64_t off);
/* ---- Files that lie (issue 12's attacks) --------------------------------- */

/* Recompute the header checksum of a version-2 or -3 header of hb bytes
 * in place (the plain XXH3-64 at offset 176, over the header with that
 * field as zero), as an attacker with write access can. */
void test_reseal(uint8_t *hdr, uint32_t hb);
/* Read record file `name` in dirfd's header (whole, up to 64 KiB), let
 * edit change it, reseal it (versions 2 and 3, over the header size it had
 * before the edit) and write it back. */
void test_header_edit(int dirfd, const char *name, void (*edit)(uint8_t *hdr, void *ctx),
		      void *ctx);
/* The decoded header of record file `name` (its own namespace). */
void test_header_read(int dirfd, const char *name, sel_record_header *h);
/* A digest of everything under dir: names, types, modes, sizes, contents,
 * symbolic link targets -- to prove a run changed nothing there. */
void test_tree_hash(const char *dir, uint8_t out[16]);
/* Turn record file `name` (a root) into a sparse lie: a resealed header of
 * the same record claiming a root's tail of `tail` pages, at key consumed
 * tail * page tokens + 1 (renamed to match: the name stays its key), the
 * file extended to that claimed length as a hole.  Returns the claimed
 * length; *key (may be NULL) the new key. */
uint64_t test_make_sparse(int dirfd, const char *name, const sel_record_ns *ns, uint32_t tail,
			  sel_key *key);
/* Rewrite record `name`'s parent key to parent and, when check is not 0,
 * its version-3 parent link check to check; resealed. */
void test_forge_parent(int dirfd, const char *name, const sel_key *parent, uint64_t check);
/* Copy file from to to (created or truncated). */
void test_copy_file(const char *from, const char *to);
/* Copy every regular file of directory src into dst (created). */
void test_copy_dir(const char *src, const char *dst);
/* Whether the namespace's directory listing holds `name`. */
bool test_has_file(const char *dir, const char *name);
/* Write record d of ns into dirfd through sel_record_write (direct I/O
 * where the filesystem takes it), its page and row bytes a pattern seeded
 * by its key; with or without the row. */
void test_record_write(int dirfd, const sel_record_ns *ns, const sel_record_desc *d, bool row);

#endif
