#!/usr/bin/env bash
# Packs what a GPU machine needs to build dray with CMake besides its own
# LibTorch, CUDA and compiler: Debian 12's gRPC, protobuf (with protoc and
# the gRPC plugins), Abseil, yaml-cpp, libpng, libjpeg, ICU, CLI11,
# nlohmann-json, cpp-httplib, prometheus-cpp, Gloo's headers and GoogleTest, as their .debs unpacked
# (`dpkg -x`) and pruned to headers, shared libraries and CMake files, in
# one archive: .gpu/deps.tar.xz (git-ignored; about 12 MB; ICU's data
# package replaced by an empty one: tools/gpu/icu_stub_data.c). Run here, where
# Debian's mirror is reachable; tools/gpu/run.sh unpacks it there.
#
#   tools/gpu/prepare.sh            # writes .gpu/deps.tar.xz
#
# Debian 12's libraries need glibc 2.36 or later at run time (Ubuntu 24.04,
# Debian 12 and 13, RHEL 10); run.sh says so if the machine's is older.
#
# With DRAY_DIFFUSERS_REPO (a git repository of huggingface/diffusers, bare
# or not), it also packs that repository's src/diffusers at
# DRAY_DIFFUSERS_REV (default: the commit tests/data/reference/qwen_image
# was made with), without its pipelines, into .gpu/diffusers.tar.xz (under
# 1 MB): run.sh then measures diffusers' transformer beside dray's.
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=(
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32
  libabsl-dev libabsl20220623 libre2-dev libre2-9 libc-ares-dev libc-ares2 libssl-dev libssl3
  libyaml-cpp-dev libyaml-cpp0.7 libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo
  libicu-dev libicu72 libcli11-dev nlohmann-json3-dev libgloo-dev libgtest-dev libgmock-dev
  libcpp-httplib-dev libcpp-httplib0.11 libbrotli-dev libbrotli1 zlib1g-dev
  prometheus-cpp-dev libprometheus-cpp-core1.0
)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root" .gpu
(cd "$work/debs" && apt-get download -o APT::Sandbox::User=root "${packages[@]}" >/dev/null)
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done

# Only what compiling and linking need: no documentation, no static
# libraries but GoogleTest's (it ships no others), no ICU tools. (gRPC's
# CMake files insist on every library they name, linked or not.)
root=$work/root/usr
lib=$root/lib/x86_64-linux-gnu
rm -rf "$root/share/doc" "$root/share/man" "$root/share/lintian" "$root/share/icu" \
  "$lib/engines-3" "$lib/ossl-modules" "$lib/pkgconfig" "$lib/icu"
find "$lib" -name '*.a' ! -name 'libg[tm]*' -delete
rm -f "$lib"/libicu{io,test,tu}* "$lib"/libgloo*
cc -shared -fPIC -Wl,-soname,libicudata.so.72 -o "$(readlink -f "$lib/libicudata.so.72")" \
  tools/gpu/icu_stub_data.c
find "$root/bin" -type f ! -name 'protoc*' ! -name 'grpc_*_plugin' -delete
find "$root" -xtype l -delete  # links to what was left out (libz.so: the machine's own)
# OpenSSL apart, where run.sh's LD_LIBRARY_PATH does not reach: the machine's
# own tools (cmake, through libcurl) need its OpenSSL 3, which may be newer
# than Debian 12's. dray links this one and runs on the machine's.
mkdir "$lib/openssl"
mv "$lib"/lib{ssl,crypto}.so.3 "$lib/openssl/"
ln -sf openssl/libssl.so.3 "$lib/libssl.so"
ln -sf openssl/libcrypto.so.3 "$lib/libcrypto.so"

tar -C "$work/root" -cf - . | xz -T0 -9 >.gpu/deps.tar.xz
echo "prepare: .gpu/deps.tar.xz ($(du -h .gpu/deps.tar.xz | cut -f1)); carry .gpu to the GPU machine"

if [[ -n ${DRAY_DIFFUSERS_REPO:-} ]]; then
  revision=$(git -C "$DRAY_DIFFUSERS_REPO" rev-parse \
    "${DRAY_DIFFUSERS_REV:-58eb52c0803ea9af3abec60841c2a093bdf1f951}^{commit}")
  mkdir "$work/diffusers"
  git -C "$DRAY_DIFFUSERS_REPO" archive "$revision" src/diffusers | tar -C "$work/diffusers" -x
  rm -rf "$work"/diffusers/src/diffusers/{pipelines,modular_pipelines}
  echo "$revision" >"$work/diffusers/src/COMMIT"
  tar -C "$work/diffusers/src" -cf - . | xz -T0 -9 >.gpu/diffusers.tar.xz
  echo "prepare: .gpu/diffusers.tar.xz ($(du -h .gpu/diffusers.tar.xz | cut -f1)), diffusers $revision"
fi
