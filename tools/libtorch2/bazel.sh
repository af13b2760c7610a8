#!/usr/bin/env bash
# Runs Bazel on this checkout against LibTorch 2 (Debian 13's libtorch-dev
# 2.6, with its gcc 14, Abseil and oneDNN) instead of the host's Debian 12
# LibTorch 1.13: in a Debian 13 root made here by debootstrap, with the
# checkout bound at /src. Needs root. The root is made on first use (2 to 4
# minutes: debootstrap from the host's Debian mirror, then
# deploy/install-deps.sh inside it) and kept, as is its Bazel cache.
#
#   tools/libtorch2/bazel.sh test //...            # the suite against LibTorch 2.6
#   tools/libtorch2/bazel.sh build //cli:dray
#   DRAY_TRIXIE_ROOT=/some/dir tools/libtorch2/bazel.sh ...   # another root
#   tools/libtorch2/bazel.sh --make-root           # only make the root (CI, ahead of time)
#   tools/libtorch2/bazel.sh --run CMD [ARG...]    # another command in the root, at /src
#
# The HTTP tests' npm clients are the host's (deploy/install-deps.sh
# installs them), bound into the root. Mounts live in a private mount
# namespace (unshare), so they end with the command, however it ends.
set -euo pipefail
checkout=$(cd "$(dirname "$0")/../.." && pwd)
root=${DRAY_TRIXIE_ROOT:-$HOME/.cache/dray/trixie}

if [[ $(id -u) -ne 0 ]]; then
  echo "libtorch2: needs root (debootstrap and chroot)" >&2
  exit 2
fi

# in_root CMD...: runs CMD in the root, the checkout at /src.
in_root() {
  unshare --mount --propagation private -- bash -c '
    root=$1 checkout=$2; shift 2
    mkdir -p "$root/src"
    mount --rbind "$root" "$root"  # / a mount point, as `ip netns` wants
    for dir in proc sys dev dev/pts; do mount --rbind "/$dir" "$root/$dir"; done
    mount --bind "$checkout" "$root/src"
    # The npm clients of the HTTP tests (plain JavaScript), as the host has them.
    clients=/usr/local/lib/dray-test-clients
    if [[ -d $clients ]]; then
      mkdir -p "$root$clients"
      mount --bind "$clients" "$root$clients"
    fi
    exec chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin \
      LANG=C.UTF-8 "$@"' in_root "$root" "$checkout" "$@"
}

if [[ ! -f $root/.dray-ready ]]; then
  mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "libtorch2: making a Debian 13 root in $root from $mirror"
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase trixie "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
    tail -n 20 "$root.debootstrap.log" >&2
    exit 1
  }
  echo "deb $mirror trixie main" >"$root/etc/apt/sources.list"
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"  # packages start no services
  chmod +x "$root/usr/sbin/policy-rc.d"
  # Bazel's bazel-* links would point the host's checkout into the root.
  echo "build --symlink_prefix=/" >"$root/etc/bazel.bazelrc"
  # No npm clients: in_root lends it the host's.
  in_root bash -c 'DEBIAN_FRONTEND=noninteractive /src/deploy/install-deps.sh --no-clients'
  touch "$root/.dray-ready"
fi
case ${1:-} in
--make-root) ;;
--run) in_root bash -c 'cd /src && exec "$@"' run "${@:2}" ;;
*) in_root bash -c 'cd /src && exec bazel "$@"' bazel "$@" ;;
esac
