#!/bin/sh
# The disk, composite and pooled store tests with device planes through the
# CUDA backend (test_store_disk_cuda, test_store_composite_cuda,
# test_store_pooled_cuda), on the fake driver of tests/cudafake.c: the GPU
# tests' scenarios run on every machine, and make check-gpu runs the same
# programs on a real GPU.
set -eu
for t in test_store_disk_cuda test_store_composite_cuda test_store_pooled_cuda; do
	echo "== $t (fake driver)"
	SELENE_TEST_FAKE_CUDA=1 "$SELENE_BUILD/tests/$t"
done
echo ok
