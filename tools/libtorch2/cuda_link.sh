#!/usr/bin/env bash
# Checks, on a machine without a GPU, that dray's CUDA paths compile and link
# against a CUDA LibTorch: Debian 13's libtorch-cuda-dev 2.6 with CUDA 12.4
# and NCCL 2.22 (deploy/install-cuda-deps.sh), in a Debian 13 root of its own
# (the CUDA LibTorch conflicts with the CPU one of tools/libtorch2/bazel.sh's
# root). Builds //cli:dray and the CUDA tests with --config=cuda, then runs
# `dray --version`, which must report "CUDA: compiled (...), no device", and
# the CUDA tests, which pass or skip for want of a device. Needs root. The
# first run makes the root (it downloads about 1.5 GB of CUDA packages; with
# its build caches the root grows to about 14 GB) and keeps it in
# ~/.cache/dray/trixie-cuda or $DRAY_TRIXIE_CUDA_ROOT.
#
#   tools/libtorch2/cuda_link.sh            # Bazel: --config=cuda
#   tools/libtorch2/cuda_link.sh --cmake    # and the GPU machines' CMake build (tools/gpu/run.sh)
#
# With --cmake it then runs tools/gpu/run.sh in the root as on a GPU machine
# (packing .gpu/deps.tar.xz first if it is missing): CMake against the CUDA
# LibTorch's TorchConfig, CUDA and NCCL found as there, `dray --version`,
# the GPU tests, `dray parity` and the gpu bench on the CPU, results in the
# root's /tmp/gpu-out.
#
# cuDNN, which Debian cannot ship, comes from $DRAY_CUDNN_DIR, by default the
# CUDA toolkit in /usr/local/cuda (cuDNN 9 for CUDA 13: enough to link and to
# start, as its kernels load only when a convolution runs on a GPU).
set -euo pipefail
checkout=$(cd "$(dirname "$0")/../.." && pwd)
export DRAY_TRIXIE_ROOT=${DRAY_TRIXIE_CUDA_ROOT:-$HOME/.cache/dray/trixie-cuda}
root=$DRAY_TRIXIE_ROOT
cudnn_dir=${DRAY_CUDNN_DIR:-/usr/local/cuda/lib64}
bazel=("$checkout/tools/libtorch2/bazel.sh")
case ${1:-} in
"" | --cmake) ;;
*)
  echo "usage: tools/libtorch2/cuda_link.sh [--cmake]" >&2
  exit 2
  ;;
esac
if [[ ! -f $cudnn_dir/libcudnn.so.9 ]]; then
  echo "cuda_link: no libcudnn.so.9 in $cudnn_dir (set DRAY_CUDNN_DIR)" >&2
  exit 2
fi

"${bazel[@]}" --make-root
if [[ ! -f $root/.dray-cuda-ready ]]; then
  echo "cuda_link: adding the CUDA LibTorch, CUDA 12.4 and NCCL to $root"
  rm -rf "$root/tmp/cuda-deps" && mkdir -p "$root/tmp/cuda-deps"
  cp "$cudnn_dir"/libcudnn*.so.9 "$root/tmp/cuda-deps/"
  "${bazel[@]}" --run deploy/install-cuda-deps.sh /tmp/cuda-deps >"$root.cuda-install.log" 2>&1 || {
    tail -n 20 "$root.cuda-install.log" >&2
    exit 1
  }
  rm -rf "$root/tmp/cuda-deps"
  touch "$root/.dray-cuda-ready"
fi

cuda_flags=(--config=cuda --repo_env=DRAY_CUDA_PATH=/usr/lib/cuda --color=no --curses=no)
tests=(//tests/gpu:gpu_test //base:cuda_devices_test //runtime/collectives/...)
"${bazel[@]}" build "${cuda_flags[@]}" //cli:dray "${tests[@]}"

version=$("${bazel[@]}" run "${cuda_flags[@]}" //cli:dray -- --version) || {
  echo "cuda_link: dray --version failed: $version" >&2
  exit 1
}
echo "$version"
if ! grep -q "^CUDA: compiled (runtime 12\.4, NCCL 2\.[0-9.]*), no device" <<<"$version"; then
  echo "cuda_link: dray --version does not report a CUDA build without a device" >&2
  exit 1
fi
"${bazel[@]}" test "${cuda_flags[@]}" "${tests[@]}"
echo "cuda_link: every CUDA path links against LibTorch 2.6 with CUDA 12.4 and NCCL"

if [[ ${1:-} == --cmake ]]; then
  [[ -f $checkout/.gpu/deps.tar.xz ]] || "$checkout/tools/gpu/prepare.sh"
  "${bazel[@]}" --run bash -c 'DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends cmake ninja-build xz-utils >/dev/null && rm -rf /tmp/gpu-out &&
    OUT=/tmp/gpu-out tools/gpu/run.sh; status=$?; cat /tmp/gpu-out/summary.txt; exit $status'
  grep -q "^CUDA: compiled (runtime 12\.4" "$root/tmp/gpu-out/version.txt" || {
    echo "cuda_link: the CMake build's dray --version does not report a CUDA build" >&2
    exit 1
  }
  echo "cuda_link: the CMake build of tools/gpu/run.sh links and runs against the CUDA LibTorch"
fi
