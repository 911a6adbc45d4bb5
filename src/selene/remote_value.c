/*
 * remote_value.c - values on Redis, pure: framing, checksum / MAC / AEAD,
 * windows, the manifest and key names (issue 16; docs/remote.md "Layout"
 * and "Values").
 *
 * DESIGN
 *   Every value starts with a 120-byte header naming what it is -- kind,
 *   protection, offload identity, layout fingerprint, record key, window
 *   index, payload length, the generation of the put that wrote it and,
 *   encrypted, the nonce -- and ends with a tag: keyed BLAKE2b-256 over
 *   header and payload with a key, XChaCha20-Poly1305 with the header as
 *   associated data when encrypting, or, without a key, XXH3-64 (catches
 *   damage, not forgery) over a manifest's header and payload and over a
 *   window's header only -- a window's payload is pages and row bytes the
 *   manifest's checksums cover, and every reader checks those.  Sealing
 *   (header and tag for payload that stays where it is) lets a writer send
 *   a window straight from the caller's pages.  A reader checks structure, then the protection its
 *   configuration demands (with a key, an unauthenticated value is refused:
 *   someone without the key wrote it), then integrity, then that the
 *   fields name exactly the value it asked for, so a value copied under
 *   another key or window is refused even though its tag is valid.
 *
 *   The manifest reuses the record header of docs/record-format.md, so a
 *   remote record is decoded and validated against the namespace by the
 *   same code as a file (sel_record_decode), and its per-page XXH3-64
 *   checksums are those a record file stores.
 *
 *   Windows cut the payload (pages, then the row) so that a page never
 *   straddles a window unless it alone exceeds one, which lets a reader of
 *   a suffix fetch whole windows and check each page as it lands.
 *
 * INVARIANTS
 *   1. decode(encode(h, p)) gives back h and p under the same keys, and
 *      encode(h, p) == sealed header || p || sealed tag (but encrypted).
 *   2. Every value is at most SEL_RV_VALUE_MAX bytes.
 *   3. The windows of a layout cover [0, tail) pages and [0, row) row bytes
 *      exactly once, in order, each at most cap bytes.
 *   4. A manifest that decodes describes a layout whose window count it
 *      states; its header decodes against the namespace.
 */
#define XXH_STATIC_LINKING_ONLY
#include "remote_value.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>
#include "xxh.h"

#include "eos.h"
#include "internal.h"

#define MAGIC "FLRV"
#define VERSION 1
enum {
	OFF_MAGIC = 0,
	OFF_VERSION = 4,
	OFF_KIND = 5,
	OFF_PROT = 6,
	OFF_RSV = 7,
	OFF_IDENTITY = 8,
	OFF_FINGERPRINT = 40,
	OFF_CONSUMED = 56,
	OFF_DIGEST = 64,
	OFF_WINDOW = 80,
	OFF_PAYLOAD = 84,
	OFF_GENERATION = 88,
	OFF_NONCE = 96,
	NONCE_BYTES = 24,
};
_Static_assert(OFF_NONCE + NONCE_BYTES == SEL_RV_HEADER, "value header size");
_Static_assert(crypto_aead_xchacha20poly1305_ietf_NPUBBYTES == NONCE_BYTES, "nonce");
_Static_assert(crypto_aead_xchacha20poly1305_ietf_ABYTES == 16, "aead tag");
_Static_assert(crypto_aead_xchacha20poly1305_ietf_KEYBYTES == 32, "aead key");

/* Manifest payload fields. */
enum {
	M_CAP = 0,
	M_WINDOWS = 4,
	M_FLAGS = 8,
	M_HEADER_BYTES = 12,
	M_HEADER = 16
};
#define M_FLAG_ROW 1u

static size_t tag_bytes(enum sel_rv_prot p)
{
	return p == SEL_RV_CHECKSUM ? 8 : p == SEL_RV_MAC ? 32 : 16;
}

static enum sel_rv_prot prot_of(const struct sel_rv_keys *k)
{
	return !k->keyed ? SEL_RV_CHECKSUM : k->encrypt ? SEL_RV_AEAD : SEL_RV_MAC;
}

static void derive(const uint8_t *secret, const char *ctx, uint8_t *out, size_t n)
{
	crypto_generichash(out, n, (const unsigned char *)ctx, strlen(ctx), secret,
			   SEL_RV_KEY_BYTES);
}

int sel_rv_keys_init(struct sel_rv_keys *k, const uint8_t *secret, bool encrypt)
{
	memset(k, 0, sizeof *k);
	if (!secret) {
		if (encrypt)
			return eos_fail(-EINVAL, "remote: encryption needs a key file");
		return 0;
	}
	sel_crypto_init();
	uint8_t id[8];
	k->keyed = true;
	k->encrypt = encrypt;
	derive(secret, "flare-remote-mac-v1", k->mac, sizeof k->mac);
	derive(secret, "flare-remote-aead-v1", k->aead, sizeof k->aead);
	derive(secret, "flare-remote-id-v1", id, sizeof id);
	sel_hex(id, sizeof id, k->id);
	return 0;
}

void sel_rv_keys_wipe(struct sel_rv_keys *k) { sodium_memzero(k, sizeof *k); }

static int hexval(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int sel_rv_key_parse(const void *buf, size_t len, uint8_t out[SEL_RV_KEY_BYTES])
{
	const uint8_t *p = buf;
	uint8_t k[SEL_RV_KEY_BYTES];
	if (len == SEL_RV_KEY_BYTES) {
		memcpy(k, p, sizeof k);
	} else {
		size_t n = len;
		if (n && p[n - 1] == '\n')
			n--;
		if (n && p[n - 1] == '\r')
			n--;
		if (n != 2 * (size_t)SEL_RV_KEY_BYTES)
			return eos_fail(SEL_EFORMAT,
					"key file of %zu bytes: expected 32 raw bytes "
					"or 64 hex digits",
					len);
		for (size_t i = 0; i < SEL_RV_KEY_BYTES; i++) {
			int hi = hexval(p[2 * i]), lo = hexval(p[2 * i + 1]);
			if (hi < 0 || lo < 0) {
				sodium_memzero(k, sizeof k);
				return eos_fail(SEL_EFORMAT,
						"key file of %zu bytes: not 32 raw bytes, "
						"and byte %zu is not a hex digit",
						len, hi < 0 ? 2 * i : 2 * i + 1);
			}
			k[i] = (uint8_t)(hi << 4 | lo);
		}
	}
	uint8_t zero = 0;
	for (size_t i = 0; i < sizeof k; i++)
		zero |= k[i];
	if (!zero)
		return eos_fail(SEL_EFORMAT, "key file: the secret is all zero bytes");
	memcpy(out, k, sizeof k);
	sodium_memzero(k, sizeof k);
	return 0;
}

int sel_rv_key_load(const char *path, uint8_t out[SEL_RV_KEY_BYTES])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return eos_fail(-errno, "key file '%s': %s", path, strerror(errno));
	struct stat st;
	int rc = 0;
	uint8_t buf[80];
	ssize_t n = 0;
	if (fstat(fd, &st) != 0) {
		rc = eos_fail(-errno, "key file '%s': %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		rc = eos_fail(-EINVAL, "key file '%s' is not a regular file", path);
		goto out;
	}
	if (st.st_mode & (S_IROTH | S_IWOTH)) {
		rc = eos_fail(-EPERM, "key file '%s' is %s by others (mode %04o): chmod 600 it",
			      path, st.st_mode & S_IROTH ? "readable" : "writable",
			      (unsigned)(st.st_mode & 07777));
		goto out;
	}
	for (;;) {
		ssize_t r = read(fd, buf + n, sizeof buf - (size_t)n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rc = eos_fail(-errno, "key file '%s': %s", path, strerror(errno));
			goto out;
		}
		if (r == 0 || (n += r) == (ssize_t)sizeof buf)
			break;
	}
	if (n == (ssize_t)sizeof buf) {
		rc = eos_fail(SEL_EFORMAT,
			      "key file '%s' of %lld bytes: expected 32 raw bytes or "
			      "64 hex digits",
			      path, (long long)st.st_size);
		goto out;
	}
	if ((rc = sel_rv_key_parse(buf, (size_t)n, out)))
		rc = eos_fail(rc, "'%s': %s", path, eos_errmsg());
out:
	sodium_memzero(buf, sizeof buf);
	close(fd);
	return rc;
}

/* ---- Values -------------------------------------------------------------- */

size_t sel_rv_value_bytes(const struct sel_rv_keys *k, size_t payload)
{
	return SEL_RV_HEADER + payload + tag_bytes(prot_of(k));
}

static void put_header(uint8_t *b, const struct sel_rv_hdr *h, enum sel_rv_prot prot)
{
	memcpy(b + OFF_MAGIC, MAGIC, 4);
	b[OFF_VERSION] = VERSION;
	b[OFF_KIND] = h->kind;
	b[OFF_PROT] = (uint8_t)prot;
	b[OFF_RSV] = 0;
	memcpy(b + OFF_IDENTITY, h->identity, SEL_IDENTITY_BYTES);
	memcpy(b + OFF_FINGERPRINT, h->fingerprint, SEL_FINGERPRINT_BYTES);
	sel_put_u64(b + OFF_CONSUMED, h->key.consumed);
	memcpy(b + OFF_DIGEST, h->key.digest.b, SEL_DIGEST_BYTES);
	sel_put_u32(b + OFF_WINDOW, h->window);
	sel_put_u32(b + OFF_PAYLOAD, h->payload);
	sel_put_u64(b + OFF_GENERATION, h->generation);
	memset(b + OFF_NONCE, 0, NONCE_BYTES);
}

/* Without a key a window's tag covers its header only: its payload is
 * pages and row bytes that the manifest's checksums cover, and every
 * reader checks those, so hashing the payload twice would buy nothing.  A
 * manifest's tag covers all of it (its checksums are its payload). */
static bool tag_covers_payload(unsigned kind, enum sel_rv_prot prot)
{
	return prot != SEL_RV_CHECKSUM || kind == SEL_RV_KIND_MANIFEST;
}

static int check_hdr(const struct sel_rv_keys *k, const struct sel_rv_hdr *h)
{
	if (h->kind != SEL_RV_KIND_MANIFEST && h->kind != SEL_RV_KIND_WINDOW)
		return eos_fail(-EINVAL, "remote value: kind %u", h->kind);
	if (!h->generation)
		return eos_fail(-EINVAL, "remote value: generation 0");
	if (sel_rv_value_bytes(k, h->payload) > SEL_RV_VALUE_MAX)
		return eos_fail(-EINVAL, "remote value: %u payload bytes make a value beyond %u",
				h->payload, SEL_RV_VALUE_MAX);
	return 0;
}

static int check_pieces(const struct sel_rv_hdr *h, const struct iovec *iov, uint32_t n)
{
	uint64_t sum = 0;
	for (uint32_t i = 0; i < n; i++) {
		if (iov[i].iov_len > h->payload - sum)
			return eos_fail(-EINVAL, "remote value: pieces exceed %u payload bytes",
					h->payload);
		sum += iov[i].iov_len;
	}
	if (sum != h->payload)
		return eos_fail(-EINVAL, "remote value: pieces of %llu bytes for a payload of %u",
				(unsigned long long)sum, h->payload);
	return 0;
}

int sel_rv_seal(const struct sel_rv_keys *k, const struct sel_rv_hdr *h, const struct iovec *iov,
		uint32_t n, uint8_t hdr[SEL_RV_HEADER], uint8_t *tag)
{
	enum sel_rv_prot prot = prot_of(k);
	int rc = check_hdr(k, h);
	if (!rc && prot == SEL_RV_AEAD)
		rc = eos_fail(-EINVAL,
			      "remote value: an encrypted value cannot be sealed in place");
	if (!rc)
		rc = check_pieces(h, iov, n);
	if (rc)
		return rc;
	put_header(hdr, h, prot);
	bool all = tag_covers_payload(h->kind, prot);
	if (prot == SEL_RV_CHECKSUM) {
		XXH3_state_t st;
		XXH3_64bits_reset(&st);
		XXH3_64bits_update(&st, hdr, SEL_RV_HEADER);
		for (uint32_t i = 0; all && i < n; i++)
			XXH3_64bits_update(&st, iov[i].iov_base, iov[i].iov_len);
		sel_put_u64(tag, XXH3_64bits_digest(&st));
		return 8;
	}
	crypto_generichash_state st;
	crypto_generichash_init(&st, k->mac, sizeof k->mac, 32);
	crypto_generichash_update(&st, hdr, SEL_RV_HEADER);
	for (uint32_t i = 0; i < n; i++)
		crypto_generichash_update(&st, iov[i].iov_base, iov[i].iov_len);
	crypto_generichash_final(&st, tag, 32);
	return 32;
}

int sel_rv_encode(const struct sel_rv_keys *k, const struct sel_rv_hdr *h, const struct iovec *iov,
		  uint32_t n, uint8_t *out, size_t cap)
{
	enum sel_rv_prot prot = prot_of(k);
	int rc = check_hdr(k, h);
	if (rc || (rc = check_pieces(h, iov, n)))
		return rc;
	size_t total = sel_rv_value_bytes(k, h->payload);
	if (cap < total)
		return eos_fail(-ENOBUFS, "remote value: %zu bytes needed, %zu given", total, cap);
	uint8_t *p = out + SEL_RV_HEADER;
	uint64_t at = 0;
	for (uint32_t i = 0; i < n; i++) {
		memcpy(p + at, iov[i].iov_base, iov[i].iov_len);
		at += iov[i].iov_len;
	}
	uint8_t *tag = p + h->payload;
	if (prot != SEL_RV_AEAD) {
		struct iovec one = {p, h->payload};
		rc = sel_rv_seal(k, h, &one, 1, out, tag);
		return rc < 0 ? rc : (int)total;
	}
	put_header(out, h, prot);
	randombytes_buf(out + OFF_NONCE, NONCE_BYTES);
	crypto_aead_xchacha20poly1305_ietf_encrypt_detached(
		p, tag, NULL, p, h->payload, out, SEL_RV_HEADER, NULL, out + OFF_NONCE, k->aead);
	return (int)total;
}

static const char *kind_name(unsigned k)
{
	return k == SEL_RV_KIND_MANIFEST ? "manifest" : k == SEL_RV_KIND_WINDOW ? "window" : "?";
}

static void what(const struct sel_rv_hdr *w, char *buf, size_t len)
{
	if (w->kind == SEL_RV_KIND_MANIFEST)
		snprintf(buf, len, "the manifest of %llu tokens",
			 (unsigned long long)w->key.consumed);
	else
		snprintf(buf, len, "window %u of %llu tokens", w->window,
			 (unsigned long long)w->key.consumed);
}

int sel_rv_decode(const struct sel_rv_keys *k, const struct sel_rv_hdr *want, uint8_t *buf,
		  size_t len, struct sel_rv_hdr *got, uint8_t **payload)
{
	char w[96];
	what(want, w, sizeof w);
	if (len < SEL_RV_HEADER + 8 || memcmp(buf + OFF_MAGIC, MAGIC, 4) != 0)
		return eos_fail(SEL_EFORMAT, "remote %s: %zu bytes without the value magic", w,
				len);
	if (buf[OFF_VERSION] != VERSION)
		return eos_fail(SEL_EFORMAT, "remote %s: value version %u (this build reads %u)", w,
				buf[OFF_VERSION], VERSION);
	unsigned kind = buf[OFF_KIND], prot = buf[OFF_PROT];
	if ((kind != SEL_RV_KIND_MANIFEST && kind != SEL_RV_KIND_WINDOW) || prot > SEL_RV_AEAD ||
	    buf[OFF_RSV])
		return eos_fail(SEL_EFORMAT, "remote %s: kind %u, protection %u, reserved %u", w,
				kind, prot, buf[OFF_RSV]);
	uint32_t pl = sel_get_u32(buf + OFF_PAYLOAD);
	size_t tb = tag_bytes(prot);
	if (len > SEL_RV_VALUE_MAX || (uint64_t)SEL_RV_HEADER + pl + tb != len)
		return eos_fail(SEL_EFORMAT, "remote %s: %zu bytes for a payload of %u", w, len,
				pl);
	if (prot != SEL_RV_AEAD) {
		for (int i = 0; i < NONCE_BYTES; i++)
			if (buf[OFF_NONCE + i])
				return eos_fail(SEL_EFORMAT,
						"remote %s: a nonce without encryption", w);
	}
	if (k->keyed && prot == SEL_RV_CHECKSUM)
		return eos_fail(-EBADMSG, "remote %s: not authenticated (written without the key)",
				w);
	if (!k->keyed && prot != SEL_RV_CHECKSUM)
		return eos_fail(-ENOKEY,
				"remote %s: authenticated with a key this host does not "
				"have (--prefix-cache-remote-key)",
				w);
	uint8_t *p = buf + SEL_RV_HEADER, *tag = p + pl;
	switch (prot) {
	case SEL_RV_CHECKSUM:
		if (XXH3_64bits(buf, SEL_RV_HEADER + (tag_covers_payload(kind, prot) ? pl : 0)) !=
		    sel_get_u64(tag))
			return eos_fail(SEL_ECORRUPT, "remote %s: the value fails its checksum", w);
		break;
	case SEL_RV_MAC: {
		uint8_t mac[32];
		crypto_generichash(mac, sizeof mac, buf, SEL_RV_HEADER + pl, k->mac, sizeof k->mac);
		if (sodium_memcmp(mac, tag, sizeof mac) != 0)
			return eos_fail(-EBADMSG, "remote %s: the value fails authentication", w);
		break;
	}
	case SEL_RV_AEAD:
		if (crypto_aead_xchacha20poly1305_ietf_decrypt_detached(
			    p, NULL, p, pl, tag, buf, SEL_RV_HEADER, buf + OFF_NONCE, k->aead) != 0)
			return eos_fail(-EBADMSG, "remote %s: the value fails authentication", w);
		break;
	}
	struct sel_rv_hdr h;
	memset(&h, 0, sizeof h);
	h.kind = (uint8_t)kind;
	h.prot = (uint8_t)prot;
	memcpy(h.identity, buf + OFF_IDENTITY, SEL_IDENTITY_BYTES);
	memcpy(h.fingerprint, buf + OFF_FINGERPRINT, SEL_FINGERPRINT_BYTES);
	h.key.consumed = sel_get_u64(buf + OFF_CONSUMED);
	memcpy(h.key.digest.b, buf + OFF_DIGEST, SEL_DIGEST_BYTES);
	h.window = sel_get_u32(buf + OFF_WINDOW);
	h.payload = pl;
	h.generation = sel_get_u64(buf + OFF_GENERATION);
	if (memcmp(h.identity, want->identity, SEL_IDENTITY_BYTES) != 0)
		return eos_fail(SEL_EIDENTITY, "remote %s: a value of another offload identity", w);
	if (memcmp(h.fingerprint, want->fingerprint, SEL_FINGERPRINT_BYTES) != 0)
		return eos_fail(SEL_ELAYOUT, "remote %s: a value of another layout fingerprint", w);
	if (h.kind != want->kind || !sel_key_eq(&h.key, &want->key) || h.window != want->window) {
		char g[96];
		what(&h, g, sizeof g);
		return eos_fail(SEL_ECORRUPT, "remote %s: the value is %s (%s)%s", w, g,
				kind_name(h.kind),
				sel_key_eq(&h.key, &want->key) ? "" : " of another key");
	}
	if (!h.generation || (want->generation && h.generation != want->generation))
		return eos_fail(-ESTALE, "remote %s: written by another put than its manifest", w);
	*got = h;
	*payload = p;
	return 0;
}

/* ---- Windows ------------------------------------------------------------- */

static uint64_t div_up(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

int sel_rv_layout_init(struct sel_rv_layout *l, uint64_t stride, uint32_t tail, uint64_t row,
		       uint32_t cap)
{
	memset(l, 0, sizeof *l);
	if (cap < SEL_RV_CAP_MIN || cap > SEL_RV_CAP_MAX)
		return eos_fail(-EINVAL,
				"remote layout: window of %u payload bytes (expected "
				"%u..%u)",
				cap, SEL_RV_CAP_MIN, SEL_RV_CAP_MAX);
	if (tail && !stride)
		return eos_fail(-EINVAL, "remote layout: %u pages of 0 bytes", tail);
	uint64_t pw = 0;
	if (tail) {
		if (stride <= cap) {
			l->ppw = (uint32_t)(cap / stride);
			pw = div_up(tail, l->ppw);
		} else {
			uint64_t wpp = div_up(stride, cap);
			if (wpp > SEL_RV_WINDOWS_MAX)
				goto big;
			l->wpp = (uint32_t)wpp;
			pw = wpp * tail;
		}
	}
	uint64_t rw = div_up(row, cap);
	if (pw > SEL_RV_WINDOWS_MAX || rw > SEL_RV_WINDOWS_MAX || pw + rw > SEL_RV_WINDOWS_MAX)
		goto big;
	l->stride = stride;
	l->tail = tail;
	l->row = row;
	l->cap = cap;
	l->page_windows = (uint32_t)pw;
	l->row_windows = (uint32_t)rw;
	l->windows = (uint32_t)(pw + rw);
	return 0;
big:
	memset(l, 0, sizeof *l);
	return eos_fail(SEL_EOVERSIZE,
			"remote layout: %u pages of %llu bytes and a row of %llu "
			"bytes need more than %u windows of %u bytes",
			tail, (unsigned long long)stride, (unsigned long long)row,
			SEL_RV_WINDOWS_MAX, cap);
}

void sel_rv_extent(const struct sel_rv_layout *l, uint32_t w, struct sel_rv_extent *e)
{
	memset(e, 0, sizeof *e);
	if (w >= l->page_windows) {
		uint64_t off = (uint64_t)(w - l->page_windows) * l->cap;
		e->row = true;
		e->off = off;
		e->len = l->row - off < l->cap ? l->row - off : l->cap;
	} else if (l->ppw) {
		e->page = w * l->ppw;
		e->pages = l->tail - e->page < l->ppw ? l->tail - e->page : l->ppw;
		e->len = e->pages * l->stride;
	} else {
		e->page = w / l->wpp;
		e->pages = 1;
		e->off = (uint64_t)(w % l->wpp) * l->cap;
		e->len = l->stride - e->off < l->cap ? l->stride - e->off : l->cap;
	}
}

uint32_t sel_rv_page_window(const struct sel_rv_layout *l, uint32_t p)
{
	return l->ppw ? p / l->ppw : p * l->wpp;
}

uint64_t sel_rv_row_bytes(const sel_record_layout *l, uint32_t flags)
{
	if (flags & SEL_RECORD_ROW_REPLICATED)
		return l->row_bytes[0];
	uint64_t n = 0;
	for (uint32_t r = 0; r < l->ranks; r++)
		n += l->row_bytes[r];
	return n;
}

/* ---- The manifest -------------------------------------------------------- */

size_t sel_rv_manifest_bytes(const sel_record_ns *ns, uint32_t tail)
{
	uint64_t n = M_HEADER + (uint64_t)ns->layout.sz.header_bytes + 8ull * tail;
	return n + SEL_RV_HEADER + 32 > SEL_RV_VALUE_MAX ? 0 : (size_t)n;
}

int sel_rv_manifest_encode(const sel_record_ns *ns, const sel_record_desc *d, bool has_row,
			   uint64_t row_checksum, uint64_t created_ns, uint32_t cap,
			   const uint64_t *cksum, uint8_t *out, size_t len)
{
	size_t need = sel_rv_manifest_bytes(ns, d->tail);
	if (!need)
		return eos_fail(SEL_EOVERSIZE,
				"remote manifest: %u pages make a manifest beyond "
				"one value",
				d->tail);
	if (len < need)
		return eos_fail(-ENOBUFS, "remote manifest: %zu bytes needed, %zu given", need,
				len);
	int hb = sel_record_encode(ns, d, has_row ? row_checksum : 0, created_ns,
				   SEL_RECORD_VERSION, out + M_HEADER, len - M_HEADER);
	if (hb < 0)
		return hb;
	sel_record_span span;
	int rc = sel_record_span_of(&ns->layout.sz, d, &span);
	if (rc)
		return rc;
	struct sel_rv_layout l;
	if ((rc = sel_rv_layout_init(&l, span.page_stride, d->tail,
				     has_row ? sel_rv_row_bytes(&ns->layout, d->flags) : 0, cap)))
		return rc;
	sel_put_u32(out + M_CAP, cap);
	sel_put_u32(out + M_WINDOWS, l.windows);
	sel_put_u32(out + M_FLAGS, has_row ? M_FLAG_ROW : 0);
	sel_put_u32(out + M_HEADER_BYTES, (uint32_t)hb);
	for (uint32_t i = 0; i < d->tail; i++)
		sel_put_u64(out + M_HEADER + hb + 8ull * i, cksum[i]);
	return (int)(M_HEADER + (size_t)hb + 8ull * d->tail);
}

int sel_rv_manifest_decode(const sel_record_ns *ns, const sel_key *want, const uint8_t *p,
			   size_t len, struct sel_rv_manifest *out)
{
	struct sel_rv_manifest m;
	memset(&m, 0, sizeof m);
	if (len < M_HEADER + SEL_RECORD_HEADER_MIN)
		return eos_fail(SEL_EFORMAT, "remote manifest of %zu bytes: too short", len);
	uint32_t flags = sel_get_u32(p + M_FLAGS), hb = sel_get_u32(p + M_HEADER_BYTES);
	m.cap = sel_get_u32(p + M_CAP);
	m.windows = sel_get_u32(p + M_WINDOWS);
	if (flags & ~M_FLAG_ROW)
		return eos_fail(SEL_EFORMAT, "remote manifest: unknown flags 0x%x", flags);
	m.has_row = flags & M_FLAG_ROW;
	if (hb < SEL_RECORD_HEADER_MIN || hb > len - M_HEADER)
		return eos_fail(SEL_EFORMAT, "remote manifest: a header of %u bytes in %zu", hb,
				len);
	int rc = sel_record_decode(p + M_HEADER, hb, ns, &m.h);
	if (rc)
		return eos_fail(rc, "remote manifest: %s", eos_errmsg());
	if (m.h.span.header_bytes != hb)
		return eos_fail(SEL_EFORMAT, "remote manifest: header bytes %u, the header says %u",
				hb, m.h.span.header_bytes);
	if (!sel_key_eq(&m.h.d.key, want))
		return eos_fail(SEL_ECORRUPT,
				"remote manifest: names %llu tokens, not the %llu "
				"asked for (or another digest)",
				(unsigned long long)m.h.d.key.consumed,
				(unsigned long long)want->consumed);
	if (!m.has_row && m.h.row_checksum)
		return eos_fail(SEL_EFORMAT, "remote manifest: a row checksum without a row");
	if ((uint64_t)len != M_HEADER + (uint64_t)hb + 8ull * m.h.d.tail)
		return eos_fail(SEL_EFORMAT, "remote manifest of %zu bytes for %u page checksums",
				len, m.h.d.tail);
	m.row_bytes = m.has_row ? sel_rv_row_bytes(&ns->layout, m.h.d.flags) : 0;
	if ((rc = sel_rv_layout_init(&m.layout, m.h.span.page_stride, m.h.d.tail, m.row_bytes,
				     m.cap)))
		return eos_fail(rc == -EINVAL ? SEL_EFORMAT : rc, "remote manifest: %s",
				eos_errmsg());
	if (m.layout.windows != m.windows)
		return eos_fail(SEL_EFORMAT, "remote manifest: %u windows, the layout has %u",
				m.windows, m.layout.windows);
	m.cksum = p + M_HEADER + hb;
	*out = m;
	return 0;
}

uint64_t sel_rv_manifest_cksum(const struct sel_rv_manifest *m, uint32_t i)
{
	return sel_get_u64(m->cksum + 8ull * i);
}

/* ---- Names --------------------------------------------------------------- */

void sel_rv_names_init(struct sel_rv_names *n, const sel_record_ns *ns, const struct sel_rv_keys *k)
{
	memset(n, 0, sizeof *n);
	if (k && k->keyed)
		snprintf(n->prefix, sizeof n->prefix, "flare-%s", k->id);
	else
		snprintf(n->prefix, sizeof n->prefix, "flare");
	snprintf(n->ns, sizeof n->ns, "%s", ns->dirname);
}

int sel_rv_manifest_name(const struct sel_rv_names *n, const sel_key *key, char *out)
{
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(key, name);
	return snprintf(out, SEL_RV_NAME_MAX, "%s:{%s/%s}:m", n->prefix, n->ns, name);
}

int sel_rv_window_name(const struct sel_rv_names *n, const sel_key *key, uint32_t w, char *out)
{
	char name[SEL_RECORD_NAME_MAX];
	sel_record_name(key, name);
	return snprintf(out, SEL_RV_NAME_MAX, "%s:{%s/%s}:w%u", n->prefix, n->ns, name, w);
}

int sel_rv_bucket_name(const struct sel_rv_names *n, const sel_digest *bucket, char *out)
{
	char hex[2 * SEL_DIGEST_BYTES + 1];
	sel_hex(bucket->b, SEL_DIGEST_BYTES, hex);
	return snprintf(out, SEL_RV_NAME_MAX, "%s:{%s/b/%s}", n->prefix, n->ns, hex);
}

int sel_rv_member_parse(const char *s, size_t len, sel_key *key)
{
	char name[SEL_RECORD_NAME_MAX];
	if (len >= sizeof name || memchr(s, '\0', len))
		return eos_fail(SEL_EFORMAT,
				"remote bucket member of %zu bytes is not a record "
				"name",
				len);
	memcpy(name, s, len);
	name[len] = '\0';
	return sel_record_name_parse(name, key);
}
