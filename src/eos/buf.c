/*
 * buf.c - aligned, zero-filled heap buffers for direct I/O.
 *
 * O_DIRECT needs the buffer address, the length and the file offset aligned
 * to the device's logical block size; EOS_ALIGN (4 KiB) covers every device
 * we run on.  Record headers, probe blocks and bounce buffers come from here.
 * (The slab pool is one mmap of its own and does not.)
 *
 * DESIGN
 *   posix_memalign over a length rounded up to the alignment, so a caller may
 *   read or write the whole rounded length with one direct I/O.  Zero-filled
 *   because these buffers end up on disk: padding must never carry old heap
 *   contents into a record file.  A zero length allocates one alignment unit
 *   so the result is always a distinct, freeable pointer.  Stateless.
 */
#include "eos.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int eos_grow(void **p, size_t *cap, size_t want, size_t elem)
{
	if (want <= *cap)
		return 0;
	size_t n = *cap ? *cap : 16;
	while (n < want) {
		if (n > SIZE_MAX / 2)
			return -ENOMEM;
		n *= 2;
	}
	if (elem && n > SIZE_MAX / elem)
		return -ENOMEM;
	void *q = realloc(*p, n * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = n;
	return 0;
}

void *eos_aligned_alloc(size_t align, size_t len)
{
	if (align < sizeof(void *) || (align & (align - 1)) != 0) {
		eos_fail(-EINVAL, "aligned alloc: alignment %zu is not a power of two >= %zu",
			 align, sizeof(void *));
		errno = EINVAL;
		return NULL;
	}
	if (len == 0)
		len = align;
	if (len > SIZE_MAX - (align - 1)) {
		eos_fail(-ENOMEM, "aligned alloc: %zu bytes rounded up to %zu overflows", len,
			 align);
		errno = ENOMEM;
		return NULL;
	}
	size_t rounded = (len + align - 1) & ~(align - 1);
	void *p = NULL;
	int rc = posix_memalign(&p, align, rounded);
	if (rc != 0) {
		char sz[32];
		eos_fail(-rc, "aligned alloc: cannot allocate %s (%zu bytes, %zu-aligned): %s",
			 eos_format_size(rounded, sz, sizeof sz), rounded, align, strerror(rc));
		errno = rc;
		return NULL;
	}
	memset(p, 0, rounded);
	return p;
}

void eos_aligned_free(void *p) { free(p); }
