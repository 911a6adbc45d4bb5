/*
 * crypto.c - one-time libsodium initialisation.
 *
 * libsodium selects its fastest BLAKE2b implementation in sodium_init();
 * every module that hashes calls sel_crypto_init() first.  Safe from any
 * thread.
 */
#include <pthread.h>
#include <stdlib.h>

#include <sodium.h>

#include "internal.h"

static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

static void crypto_init_once(void)
{
	if (sodium_init() < 0)
		abort(); /* libsodium cannot run at all on this machine */
}

void sel_crypto_init(void) { pthread_once(&crypto_once, crypto_init_once); }
