#!/usr/bin/env bash
# Installs every Debian 12 package that building, testing and running dray need.
# Idempotent: packages already present are left alone; safe to run again.
#
#   deploy/install-deps.sh              # everything, as root or with sudo available
#   deploy/install-deps.sh --build-only # what `bazel build //cli:dray` needs (the image's build stage)
set -euo pipefail

build_packages=(
  # Build system and toolchain.
  bazel-bootstrap bazel-rules-java g++ git ca-certificates pkgconf
  # RPC and wire format.
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  # Core libraries.
  libabsl-dev libtorch-dev libgloo-dev
  # Tests and benchmarks.
  libgtest-dev libgmock-dev libbenchmark-dev
  # Images and configuration.
  libpng-dev libjpeg-dev libyaml-cpp-dev
  # A fast BLAS for LibTorch on CPU (Debian's reference BLAS is ~7x slower).
  libopenblas0-pthread
  # Unicode (tokenizer regular expressions and normalization).
  libicu-dev
  # Command line and JSON (configs, safetensors headers).
  libcli11-dev nlohmann-json3-dev
)
test_packages=(
  # Every C++ file as clang-format writes it (tests/style).
  clang-format
  # The Python client and reward-server examples and their tests (TLS: openssl).
  python3 python3-grpcio python3-protobuf python3-numpy openssl
  # Multi-node tests: network namespaces stand in for hosts, a real Slurm runs jobs on them.
  iproute2 slurm-wlm slurmctld slurmd slurm-client munge
  # Kubernetes manifests, checked offline against the API's typed models.
  python3-kubernetes python3-yaml
  # Container tests: an image built from a debootstrap base, run by podman.
  debootstrap podman podman-compose buildah runc containernetworking-plugins
  golang-github-containernetworking-plugin-dnsname iptables
)

packages=("${build_packages[@]}")
case ${1:-} in
--build-only) ;;
"") packages+=("${test_packages[@]}") ;;
*)
  echo "install-deps: unknown argument '$1' (the only option is --build-only)" >&2
  exit 2
  ;;
esac

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
