#!/bin/sh
# Runs docs/workers.md's example and checks what it prints.
set -eu
out=$("$TEST_SRCDIR/$TEST_WORKSPACE/examples/hello_workers" 2>&1)
echo "$out"
echo "$out" | grep -q "init_model answered by 2 ranks"
echo "$out" | grep -q "x=4  y=8  (rank 1)"
echo "$out" | grep -q "x=0  y=0  (rank 0)"
