#!/usr/bin/env bash
# Installs every Debian 12 package that building, testing and running dray need.
# Idempotent: packages already present are left alone; safe to run again.
#
#   deploy/install-deps.sh              # everything, as root or with sudo available
#   deploy/install-deps.sh --build-only # what `bazel build //cli:dray` needs (the image's build stage)
#   deploy/install-deps.sh --no-clients # everything but the npm client of the HTTP tests
#
# Everything includes OpenAI's Node.js client, which the HTTP tests drive,
# installed by npm from tests/http's lock file into
# /usr/local/lib/dray-test-clients.
set -euo pipefail

build_packages=(
  # Build system and toolchain.
  bazel-bootstrap bazel-rules-java g++ git ca-certificates pkgconf
  # RPC and wire format.
  libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  # Core libraries.
  libabsl-dev libtorch-dev libgloo-dev
  # Tests and benchmarks; SentencePiece is the reference the T5 tokenizer's
  # parity test holds dray's own to (nothing but that test links it).
  libgtest-dev libgmock-dev libbenchmark-dev libsentencepiece-dev
  # Images and configuration.
  libpng-dev libjpeg-dev libyaml-cpp-dev
  # A fast BLAS for LibTorch on CPU (Debian's reference BLAS is ~7x slower).
  libopenblas0-pthread
  # Unicode (tokenizer regular expressions and normalization).
  libicu-dev
  # Command line and JSON (configs, safetensors headers).
  libcli11-dev nlohmann-json3-dev
  # dray serve's HTTP port and its metrics.
  libcpp-httplib-dev prometheus-cpp-dev
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
  # HTTP tests: curl, Node.js for OpenAI's official client, a browser driven by
  # Selenium, a Prometheus server.
  curl nodejs chromium chromium-driver python3-selenium prometheus
  # The build for GPU machines (CMakeLists.txt), which CI builds too.
  cmake ninja-build
)

packages=("${build_packages[@]}")
clients=false
case ${1:-} in
--build-only) ;;
--no-clients) packages+=("${test_packages[@]}") ;;
"")
  packages+=("${test_packages[@]}")
  clients=true
  ;;
*)
  echo "install-deps: unknown argument '$1' (options: --build-only, --no-clients)" >&2
  exit 2
  ;;
esac
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi

# install_clients: the npm packages of tests/http's lock file, unless the
# same lock file is installed already.
install_clients() {
  local from dir=/usr/local/lib/dray-test-clients
  from="$(cd "$(dirname "$0")/.." && pwd)/tests/http"
  if cmp -s "$from/package-lock.json" "$dir/package-lock.json" && [[ -d $dir/node_modules ]]; then
    echo "install-deps: the HTTP tests' clients already installed"
    return
  fi
  if ! command -v npm >/dev/null; then
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm
  fi
  $sudo mkdir -p "$dir"
  $sudo cp "$from/package.json" "$from/package-lock.json" "$dir/"
  $sudo npm ci --prefix "$dir" --no-audit --no-fund --loglevel=error
  echo "install-deps: the HTTP tests' clients installed in $dir"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
else
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if $clients; then install_clients; fi
echo "install-deps: done"
