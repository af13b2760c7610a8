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
# $OUT receives six files (the device tool brings back at most eight):
# summary.txt (one line per step: ok or FAILED, and its seconds),
# version.txt (the machine: GPU, driver, compiler, CMake, PyTorch; then
# `dray --version`), build.log, gpu_test.log (each test suite in a process
# of its own, so that a crash costs its suite alone; the tests print their
# measured errors, and a crash its report: tests/gpu/crash_report.cc),
# parity.txt, and bench_gpu.jsonl: `dray bench --suite gpu`, then diffusers'
# transformer measured the same way (tools/gpu/diffusers_bench.py) where
# prepare.sh packed diffusers (.gpu/diffusers.tar.xz). DRAY_BENCH_ARGS
# (--quick) goes to both. A failed step but the build does not stop the
# next; the exit status is the number of failed steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?set OUT to the folder that receives the results}
mkdir -p "$out"
work=${DRAY_GPU_WORK:-/tmp/dray-gpu}
deps=$work/deps
build=$work/build
failed=0

# step NAME LOG COMMAND...: runs COMMAND, its output to $out/LOG (after
# what earlier steps wrote there in this run) and to the terminal's tail,
# and records the result in summary.txt.
declare -A written
step() {
  local name=$1 log=$2 start=$SECONDS result=ok append=
  shift 2
  echo "== $name"
  [[ -n ${written[$log]:-} ]] && append=-a
  written[$log]=1
  "$@" > >(tee $append "$out/$log") 2>&1 || { result=FAILED; failed=$((failed + 1)); }
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
describe_machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
  c++ --version | head -1
  cmake --version | head -1
  env -u LD_LIBRARY_PATH python3 -c \
    'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda)' 2>&1 || true
  echo "glibc $glibc, $(nproc) cores, NCCL header: ${nccl_header:-none beside PyTorch}"
}
configure_and_build() {
  cmake -S . -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$torch_prefix;$deps/usr" \
    ${nccl_root:+-DNCCL_ROOT="$nccl_root"} ${DRAY_CMAKE_ARGS:-} &&
    cmake --build "$build" -j "$(nproc)"
}
step machine version.txt describe_machine
step build build.log configure_and_build
((failed == 0)) || exit "$failed"
dray=$build/dray
step version version.txt "$dray" --version
# Each step after the build within a time limit, so that a hang (a GPU's
# collective, say) costs one step's results, not the run's.
limit="timeout ${DRAY_STEP_TIMEOUT:-300}"
# gpu_tests: each suite of the GPU tests in a process of its own, its output
# line-buffered, so that nothing printed before a crash is lost; fails if
# any suite did.
gpu_tests() {
  local suite failures=0
  for suite in $("$build/gpu_test" --gtest_list_tests | sed -nE 's/^([A-Za-z_][A-Za-z0-9_/]*)\.( .*)?$/\1/p'); do
    $limit stdbuf -oL "$build/gpu_test" --gtest_filter="$suite.*" || failures=$((failures + 1))
  done
  ((failures == 0))
}
step gpu_test gpu_test.log gpu_tests
step bench bench_gpu.jsonl $limit "$dray" bench --suite gpu --json ${DRAY_BENCH_ARGS:-}
if [[ -f .gpu/diffusers.tar.xz ]]; then
  rm -rf "$work/diffusers" && mkdir -p "$work/diffusers" && tar -C "$work/diffusers" -xJf .gpu/diffusers.tar.xz
  step diffusers bench_gpu.jsonl $limit env -u LD_LIBRARY_PATH \
    python3 tools/gpu/diffusers_bench.py --diffusers "$work/diffusers" ${DRAY_BENCH_ARGS:-}
fi
step parity parity.txt $limit "$dray" parity --reference tests/data/reference
exit "$failed"
