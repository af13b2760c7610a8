#!/usr/bin/env bash
# A certificate authority and one certificate for dray's TLS flags:
#
#   deploy/make-certs.sh DIR NAME...
#
# writes DIR/ca.crt (--tls-ca), DIR/tls.crt (--tls-cert) and DIR/tls.key
# (--tls-key, readable by its owner only) for the NAMEs peers dial: host
# names, wildcards (*.dray-nodes.default.svc.cluster.local) or IP addresses.
# The authority's key, DIR/ca.key, is reused when it exists, so certificates
# made earlier with it stay valid; keep it away from the job (move it, or
# delete it). Any other authority (cert-manager, a company CA) does as well.
set -euo pipefail

dir=${1:?usage: make-certs.sh DIR NAME... (the names or addresses peers dial)}
shift
if (($# == 0)); then
  echo "make-certs.sh: name at least one host or address that peers dial" >&2
  exit 2
fi
alt_names=()
for name in "$@"; do
  if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then alt_names+=("IP:$name"); else alt_names+=("DNS:$name"); fi
done
# quietly COMMAND...: runs openssl, showing its chatter only if it fails.
quietly() {
  local said
  said=$("$@" 2>&1) || {
    echo "make-certs.sh: $* failed: $said" >&2
    exit 1
  }
}
mkdir -p "$dir"
umask 077
if [[ ! -s $dir/ca.key ]]; then
  quietly openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=dray-ca \
    -keyout "$dir/ca.key" -out "$dir/ca.crt"
fi
quietly openssl req -newkey rsa:2048 -nodes -subj /CN=dray -keyout "$dir/tls.key" -out "$dir/tls.csr"
quietly openssl x509 -req -days 365 -in "$dir/tls.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
  -CAcreateserial -out "$dir/tls.crt" -extfile <(IFS=, && echo "subjectAltName=${alt_names[*]}")
rm -f "$dir/tls.csr" "$dir/ca.srl"
chmod 644 "$dir/ca.crt" "$dir/tls.crt"
