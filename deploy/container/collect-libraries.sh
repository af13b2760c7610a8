#!/usr/bin/env bash
# Copies a binary and every shared library it loads into ROOT, at the paths the
# dynamic loader finds them (symlinks such as Debian's BLAS alternative resolved),
# so that ROOT laid over a bare Debian image of the same release runs it.
#
#   deploy/container/collect-libraries.sh bazel-bin/cli/dray /image
set -euo pipefail

binary=${1:?usage: collect-libraries.sh BINARY ROOT}
root=${2:?usage: collect-libraries.sh BINARY ROOT}
mkdir -p "$root/usr/local/bin"
cp -L "$binary" "$root/usr/local/bin/"

missing=$(ldd "$binary" | grep 'not found' || true)
if [[ -n $missing ]]; then
  echo "collect-libraries: $binary needs libraries that are not installed:" >&2
  echo "$missing" >&2
  exit 1
fi
# "libfoo.so.1 => /usr/lib/.../libfoo.so.1 (0x...)" and the loader's own line.
ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
  while read -r library; do
    # Directories as they really are: /lib is a link to /usr/lib on Debian 12.
    directory=$(readlink -f "$(dirname "$library")")
    mkdir -p "$root$directory"
    cp -L "$library" "$root$directory/"
  done
