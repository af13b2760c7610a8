#!/usr/bin/env bash
# The Kubernetes manifests, checked offline (no cluster runs here): every
# document fits python3-kubernetes' typed models and every dray flag in them
# exists (check_manifests.py), and the checker does catch an unknown field,
# a wrong type, a flag dray lacks and a variable the container lacks.
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
check=(/usr/bin/python3 "$root/tests/cluster/check_manifests.py" "$dray")
manifest="$root/deploy/kubernetes/dray-train.yaml"
serve_manifest="$root/deploy/kubernetes/dray-serve.yaml"
out="$TEST_TMPDIR"
fail() { echo "FAIL: $*" >&2; exit 1; }

"${check[@]}" "$manifest" "$serve_manifest" || fail "the manifests do not check out"

# refused MUTATION EXPECTED: the checker fails on the mutated manifest, naming EXPECTED.
refused() {
  sed "$1" "$manifest" >"$out/mutated.yaml"
  ! cmp -s "$manifest" "$out/mutated.yaml" || fail "the mutation $1 changed nothing"
  if "${check[@]}" "$out/mutated.yaml" 2>"$out/error.txt"; then fail "$1 passed the checker"; fi
  grep -q "$2" "$out/error.txt" || fail "$1: $(cat "$out/error.txt")"
}
refused 's/clusterIP: None/clusterIP: None\n  bogusField: 1/' "has no field 'bogusField'"
refused 's/completions: 2/completions: two/' "invalid literal"
refused 's/--gpus=1/--gpu=1/' "has no flag --gpu"
refused 's/- name: NODE_INDEX/- name: NODE_NUMBER/' 'NODE_INDEX) in --address=.* is not in the container'"'"'s env'
echo PASS
