#!/usr/bin/env bash
# Builds dray on a machine without Bazel against that machine's own LibTorch
# (the one its python3's PyTorch carries; CUDA and NCCL where it has them),
# then runs the GPU tests, `dray parity` on every reference case and
# `dray bench --suite gpu`, and writes what they print to $OUT. Run from the
# checkout's root after tools/gpu/prepare.sh has written .gpu/deps.tar.xz
# (the libraries that machine lacks) and .gpu has travelled with the tree.
#
#   OUT=/tmp/out tools/gpu/run.sh        # on the GPU machine
#   OUT=/tmp/out tools/gpu/run.sh        # here: a dry run on the CPU LibTorch
#
# $OUT receives: version.txt (`dray --version`), build.log, gpu_test.log
# and gpu_test.xml, parity.txt, bench_gpu.jsonl and summary.txt (one line
# per step: ok or FAILED, and its seconds). A failed step but the build does
# not stop the next; the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?set OUT to the folder that receives the results}
mkdir -p "$out"
work=${DRAY_GPU_WORK:-/tmp/dray-gpu}
deps=$work/deps
build=$work/build
failed=0

# step NAME LOG COMMAND...: runs COMMAND, its output to $out/LOG and to the
# terminal's tail, and records the result in summary.txt.
step() {
  local name=$1 log=$2 start=$SECONDS result=ok
  shift 2
  echo "== $name"
  "$@" > >(tee "$out/$log") 2>&1 || { result=FAILED; failed=$((failed + 1)); }
  printf '%-10s %-8s %4ss\n' "$name" "$result" $((SECONDS - start)) | tee -a "$out/summary.txt"
}

: >"$out/summary.txt"
glibc=$(getconf GNU_LIBC_VERSION | cut -d' ' -f2)
if [[ $(printf '%s\n2.36\n' "$glibc" | sort -V | head -1) != 2.36 ]]; then
  echo "run: glibc $glibc is older than the 2.36 Debian 12's libraries in .gpu/deps.tar.xz need" |
    tee -a "$out/summary.txt"
  exit 1
fi
[[ -f .gpu/deps.tar.xz ]] || { echo "run: no .gpu/deps.tar.xz: run tools/gpu/prepare.sh first" >&2; exit 1; }
rm -rf "$deps" && mkdir -p "$deps" && tar -C "$deps" -xJf .gpu/deps.tar.xz
export PATH=$deps/usr/bin:$PATH
export LD_LIBRARY_PATH=$deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# The LibTorch: python3's PyTorch's, else the system's (Debian's libtorch-dev).
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
# NCCL: PyTorch's own (an nvidia-nccl wheel beside it), where the CUDA
# toolkit has none.
site=$(python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null || true)
nccl_header=$(find "${site:-/nonexistent}/nvidia" -name nccl.h 2>/dev/null | head -1)
nccl_root=${nccl_header:+$(dirname "$(dirname "$nccl_header")")}
configure_and_build() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" \
    ${nccl_root:+-DNCCL_ROOT="$nccl_root"} ${DRAY_CMAKE_ARGS:-} &&
    cmake --build "$build" -j "$(nproc)"
}
step build build.log configure_and_build
((failed == 0)) || exit "$failed"
dray=$build/dray
step version version.txt "$dray" --version
step gpu_test gpu_test.log "$build/gpu_test" --gtest_output="xml:$out/gpu_test.xml"
step parity parity.txt "$dray" parity --reference tests/data/reference
step bench bench_gpu.jsonl "$dray" bench --suite gpu --json ${DRAY_BENCH_ARGS:-}
exit "$failed"
