/*
 * test_store_disk_cuda.c - the disk store's tests (tests/test_store_disk.c,
 * every scenario and disk I/O mode) with the page planes and state rows in
 * device memory, copied through the CUDA backend (design 2.5 Transfers):
 * round trips of 1 to 200 pages byte-exact after poisoning the device,
 * chains and restarts, corruption, the disk limit, faults, TP2 with
 * replicated and split planes (ranks on devices 0 and 1, or both on 0),
 * each store's transport "cuda".  The parts that hold or fail copies use
 * the stub backend, which copies with cuMemcpyDtoH / cuMemcpyHtoD in this
 * mode.  On a real GPU the second process of the namespace test is left
 * out (a CUDA context does not survive fork).
 *
 * Exits 77, saying why, where libcuda.so.1 cannot be loaded or no device
 * is visible.  SELENE_TEST_FAKE_CUDA=1 runs it on tests/cudafake.c instead
 * (make check does, in tests/test_store_cuda_fake.sh); make check-gpu runs
 * it on the GPU.
 */
#define STORE_TEST_MAIN test_store_disk_main
#include "test_store_disk.c"

int main(void) { return sfx_cuda_main("test_store_disk_cuda", test_store_disk_main); }
