#!/usr/bin/env bash
# Checks the image for GPU nodes (deploy/container/gpu.Dockerfile) as far as a
# machine without a GPU can: it builds, and `dray --version` inside it reports
# a CUDA build ("CUDA: compiled (runtime 12.4, NCCL ...), no device"). Needs
# root, podman and debootstrap (deploy/install-deps.sh installs them). The
# Debian 13 base is imported from debootstrap, as no image can be pulled
# here, and kept as a cache; the build reuses the Bazel cache of
# tools/libtorch2/cuda_link.sh's root, so run that first.
#
#   tools/gpu/check_image.sh      # cuDNN from $DRAY_CUDNN_DIR, default /usr/local/cuda/lib64
set -euo pipefail
checkout=$(cd "$(dirname "$0")/../.." && pwd)
cudnn_dir=${DRAY_CUDNN_DIR:-/usr/local/cuda/lib64}
cache=${DRAY_TRIXIE_CUDA_ROOT:-$HOME/.cache/dray/trixie-cuda}/root/.cache/dray
base=localhost/dray-base:trixie
image=localhost/dray-gpu:latest
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_image: $*" >&2; exit 1; }
[[ -f $cudnn_dir/libcudnn.so.9 ]] || fail "no libcudnn.so.9 in $cudnn_dir (set DRAY_CUDNN_DIR)"
cudnn_dir=$(readlink -f "$cudnn_dir")  # a volume must name the folder itself

# As tests/container/container_test.sh: this VM lacks CAP_SYS_RESOURCE.
export CONTAINERS_CONF="$work/containers.conf"
printf '[containers]\ndefault_ulimits=["nofile=20000:20000","nproc=32768:32768"]\n[engine]\nruntime="runc"\n' \
  >"$CONTAINERS_CONF"

if ! podman image exists "$base"; then
  mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  debootstrap --variant=minbase trixie "$work/base" "${mirror:-http://deb.debian.org/debian}" \
    >"$work/debootstrap.log" 2>&1 || fail "debootstrap failed: $(tail -n 5 "$work/debootstrap.log")"
  tar -C "$work/base" -c . | podman import - "$base" >/dev/null
fi

mkdir -p "$cache"
podman rmi -f "$image" >/dev/null 2>&1 || true
podman build -f "$checkout/deploy/container/gpu.Dockerfile" -t "$image" --build-arg "BASE=$base" \
  --layers=false --network host -v "$cache:/root/.cache/dray" -v "$cudnn_dir:/cudnn:ro" \
  "$checkout" >"$work/build.log" 2>&1 || fail "the image did not build: $(tail -n 20 "$work/build.log")"
grep "INFO: [0-9]* processes" "$work/build.log" || true  # how much the Bazel cache spared
version=$(podman run --rm --network none "$image" --version) || fail "dray does not run in the image"
echo "$version"
grep -q "^CUDA: compiled (runtime 12\.4, NCCL 2\.[0-9.]*), no device" <<<"$version" ||
  fail "dray --version in the image does not report a CUDA build"
echo "check_image: $image built, $(podman image inspect "$image" --format '{{.Size}}' |
  awk '{printf "%.1f GB", $1 / 1e9}'), and runs"
