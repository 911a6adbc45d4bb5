/*
 * test_store_composite_cuda.c - the composite store's tests
 * (tests/test_store_composite.c: memory hits, pressure and maintenance
 * writes, durability across a restart, read-through, chains, in-flight
 * writes, disk eviction, streaming, write failures, backpressure, TP2
 * packing decisions in the files) with the page planes and state rows in
 * device memory, copied through the CUDA backend (design 2.5 Transfers),
 * byte-exact after poisoning the device; each store's transport "cuda".
 *
 * Exits 77, saying why, where libcuda.so.1 cannot be loaded or no device
 * is visible.  SELENE_TEST_FAKE_CUDA=1 runs it on tests/cudafake.c instead
 * (make check does, in tests/test_store_cuda_fake.sh); make check-gpu runs
 * it on the GPU.
 */
#define STORE_TEST_MAIN test_store_composite_main
#include "test_store_composite.c"

int main(void) { return sfx_cuda_main("test_store_composite_cuda", test_store_composite_main); }
