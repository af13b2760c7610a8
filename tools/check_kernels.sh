#!/usr/bin/env bash
# dray's numerics tests under every set of CPU kernels this machine can run,
# so that no tolerance holds only on the machine it was written on: another
# CPU vendor or generation makes OpenBLAS, ATen and oneDNN pick other
# kernels, which round (and sum) in another order. Settings:
#   OpenBLAS core types (OPENBLAS_CORETYPE) Prescott ... SkylakeX, at one and
#   two threads (OPENBLAS_NUM_THREADS); ATen's vector width
#   (ATEN_CPU_CAPABILITY: AVX2 where the CPU would pick AVX-512, and scalar);
#   oneDNN's instruction set (ONEDNN_MAX_CPU_ISA).
# A core type this CPU cannot run (SkylakeX without AVX-512) is skipped and
# said so. Prints one line per setting; exits 1 if any failed.
#
#   tools/check_kernels.sh             # every setting (~3 minutes each on 2 cores)
#   tools/check_kernels.sh Zen threads # the settings whose names contain these words
set -uo pipefail
cd "$(dirname "$0")/.."

targets=(
  //tests/models/... //tests/rl/... //tests/sharding/...
  //tests/train:trainer_test //tests/train:checkpoint_test //tests/train:sft_test
  //tests/train:vae_training_test //tests/train:embedded_model_test
  //tests/edit:image_edit_worker_test
)
# name, then the environment it sets.
settings=(
  "blas-Prescott OPENBLAS_CORETYPE=Prescott"
  "blas-Nehalem OPENBLAS_CORETYPE=Nehalem"
  "blas-Sandybridge OPENBLAS_CORETYPE=Sandybridge"
  "blas-Haswell OPENBLAS_CORETYPE=Haswell"
  "blas-Zen OPENBLAS_CORETYPE=Zen"
  "blas-SkylakeX OPENBLAS_CORETYPE=SkylakeX"
  "blas-Haswell-2-threads OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=2"
  "blas-default-2-threads OPENBLAS_NUM_THREADS=2"
  "aten-avx2 ATEN_CPU_CAPABILITY=avx2"
  "aten-default-vectors ATEN_CPU_CAPABILITY=default"
  "onednn-sse41 ONEDNN_MAX_CPU_ISA=SSE41"
)

# runs_here CORETYPE: whether OpenBLAS runs that core type's kernels on this
# CPU (it dies on instructions the CPU lacks, or falls back to another).
runs_here() {
  local core
  core=$(OPENBLAS_CORETYPE=$1 OPENBLAS_VERBOSE=2 /usr/bin/python3 -c \
    'import numpy; a = numpy.ones((64, 64), numpy.float32); a @ a' 2>&1) || return 1
  grep -qx "Core: $1" <<<"$core"
}

failed=0
for setting in "${settings[@]}"; do
  read -r name env <<<"$setting"
  if (($# > 0)); then
    wanted=0
    for word in "$@"; do [[ $name == *"$word"* ]] && wanted=1; done
    ((wanted)) || continue
  fi
  core=$(sed -n 's/.*OPENBLAS_CORETYPE=\([A-Za-z]*\).*/\1/p' <<<"$env")
  if [[ -n $core ]] && ! runs_here "$core"; then
    echo "check_kernels: $name skipped: this CPU cannot run OpenBLAS's $core kernels"
    continue
  fi
  flags=()
  for variable in $env; do flags+=("--test_env=$variable"); done
  log=$(mktemp)
  if bazel test "${targets[@]}" "${flags[@]}" --color=no --curses=no >"$log" 2>&1; then
    echo "check_kernels: $name passed ($env)"
  else
    failed=1
    echo "check_kernels: $name FAILED ($env):"
    grep -E "FAILED|Failure|Expected|Which is|actual" "$log" | head -n 40
  fi
  rm -f "$log"
done
exit "$failed"
