#!/usr/bin/env bash
# Turns a Debian 13 system that deploy/install-deps.sh has set up into one
# that builds dray's CUDA paths (`bazel build --config=cuda
# --repo_env=DRAY_CUDA_PATH=/usr/lib/cuda`): the CUDA LibTorch 2.6
# (libtorch-cuda-dev, contrib, in place of libtorch-dev), CUDA 12.4
# (nvidia-cuda-toolkit, non-free), NCCL 2.22 (libnccl-dev, contrib) and Gloo
# built with CUDA (libgloo-cuda-dev, in place of libgloo-dev).
# Used by tools/libtorch2/cuda_link.sh and deploy/container/gpu.Dockerfile.
#
#   deploy/install-cuda-deps.sh CUDNN_DIR
#
# cuDNN: Debian ships it only as an installer (nvidia-cudnn) that downloads
# it from NVIDIA while installing, which cannot work offline. An empty
# package of that name stands in for it, and the cuDNN 9 libraries
# (libcudnn*.so.9) are copied from CUDNN_DIR. libtorch_cuda links only the
# front library, libcudnn.so.9, which loads the others when a convolution
# first runs on a GPU: to run dray's VAE on GPUs, CUDNN_DIR must hold all of
# cuDNN 9 for CUDA 12 (NVIDIA's redistributable archive's lib/).
set -euo pipefail
cudnn_dir=${1:?usage: deploy/install-cuda-deps.sh CUDNN_DIR (holding libcudnn.so.9)}
if [[ ! -f $cudnn_dir/libcudnn.so.9 ]]; then
  echo "install-cuda-deps: no libcudnn.so.9 in $cudnn_dir" >&2
  exit 2
fi
if ! grep -qs '^VERSION_CODENAME=trixie' /etc/os-release; then
  echo "install-cuda-deps: needs Debian 13 (trixie): its contrib has the CUDA LibTorch" >&2
  exit 2
fi

# contrib and non-free beside main, in whichever form the sources are listed.
sed -i '/^deb .* main$/s/ main$/ main contrib non-free/' /etc/apt/sources.list 2>/dev/null || true
sed -i '/^Components: main$/s/$/ contrib non-free/' /etc/apt/sources.list.d/*.sources 2>/dev/null || true

stand_in=$(mktemp -d)
mkdir "$stand_in/DEBIAN"
cat >"$stand_in/DEBIAN/control" <<'CONTROL'
Package: nvidia-cudnn
Version: 9.0.0.312~cuda12
Architecture: all
Maintainer: dray <dray@localhost>
Description: stand-in for the cuDNN installer (deploy/install-cuda-deps.sh)
 The cuDNN 9 libraries are copied in from a folder instead of downloaded.
CONTROL
dpkg-deb --build "$stand_in" "$stand_in.deb" >/dev/null
dpkg -i "$stand_in.deb" >/dev/null
apt-mark hold nvidia-cudnn >/dev/null  # no upgrade may bring back the installer
rm -rf "$stand_in" "$stand_in.deb"
cp "$cudnn_dir"/libcudnn*.so.9 /usr/lib/x86_64-linux-gnu/

apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  libtorch-cuda-dev libgloo-cuda-dev nvidia-cuda-toolkit libnccl-dev
echo "install-cuda-deps: done"
