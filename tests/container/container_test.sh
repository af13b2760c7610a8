#!/usr/bin/env bash
# The container image and compose file, for real: builds
# deploy/container/Dockerfile with podman (on a Debian 12 base imported from
# debootstrap, as no image can be pulled here; the build stage reuses this
# machine's Bazel cache), then runs deploy/container/compose.yaml with
# podman-compose: the controller in one container and a `dray node` agent in
# each of two others on the project's network, all on TLS with a certificate
# for their names (deploy/make-certs.sh). The trained adapters and
# metrics equal a plain `dray train --workers 2` run's byte for byte. Needs
# root and podman (deploy/install-deps.sh installs it), and skips without them.
#
# The base image is kept between runs as a cache (like Bazel's); containers,
# the network and its bridge are removed.
set -euo pipefail

if [[ $(id -u) -ne 0 ]] || ! command -v podman-compose >/dev/null; then
  echo "SKIPPED: needs root and podman-compose (deploy/install-deps.sh installs it)"
  exit 0
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
compose="$root/deploy/container/compose.yaml"
# The image is built from the checkout itself, which Bazel's runfiles link to.
checkout=$(cd "$(dirname "$(readlink -f "$root/deploy/container/Dockerfile")")/../.." && pwd)
out="$TEST_TMPDIR"
project=drayct  # a run cleans up what a killed run left
exec 9>"/run/lock/dray-$project.lock" && flock 9
fail() { echo "FAIL: $*" >&2; tail -n 20 "$out"/*.log >&2 || true; exit 1; }

# This VM lacks CAP_SYS_RESOURCE and has hybrid cgroups: runc, and ulimits
# under the hard limits.
export CONTAINERS_CONF="$out/containers.conf"
cat >"$CONTAINERS_CONF" <<CONF
[containers]
default_ulimits=["nofile=20000:20000","nproc=32768:32768"]
[engine]
runtime="runc"
CONF

cleanup() {
  local network=${project}_default bridge
  podman ps -aq --filter "label=io.podman.compose.project=$project" | xargs -r podman rm -f >/dev/null
  if podman network exists "$network"; then
    bridge=$(podman network inspect "$network" --format '{{.NetworkInterface}}')
    podman network rm -f "$network" >/dev/null
    ip link del "$bridge" 2>/dev/null || true  # podman leaves it behind
  fi
  # And the CNI firewall plugin's chains, once no container's rules are left in them.
  if [[ $(iptables -S CNI-FORWARD 2>/dev/null | grep -cv -e "^-N " -e "CNI-ADMIN") == 0 ]]; then
    iptables -D FORWARD -m comment --comment "CNI firewall plugin rules" -j CNI-FORWARD
    iptables -F CNI-FORWARD && iptables -X CNI-FORWARD && iptables -X CNI-ADMIN
  fi 2>/dev/null || true
}
trap cleanup EXIT
cleanup

# The base: Debian 12 from the mirror apt uses.
base=localhost/dray-base:bookworm
if ! podman image exists "$base"; then
  mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
  debootstrap --variant=minbase bookworm "$out/base" "${mirror:-http://deb.debian.org/debian}" \
    >"$out/debootstrap.log" 2>&1 || fail "debootstrap failed"
  tar -C "$out/base" -c . | podman import - "$base" >/dev/null
  rm -rf "$out/base"
fi

image=localhost/dray-test:latest
cache="$(getent passwd "$(id -un)" | cut -d: -f6)/.cache/dray"
mkdir -p "$cache"
# On the host's network: the build makes no bridge or firewall rules to clean
# up. No intermediate layers are kept (its build stage alone is 3 GB a run),
# and the last run's image goes.
podman rmi -f "$image" >/dev/null 2>&1 || true
podman build -f "$checkout/deploy/container/Dockerfile" -t "$image" --build-arg "BASE=$base" \
  --layers=false --network host -v "$cache:/root/.cache/dray" "$checkout" >"$out/build.log" 2>&1 ||
  fail "the image did not build"
grep "INFO: [0-9]* processes" "$out/build.log" || true  # how much the Bazel cache spared
podman run --rm --network none "$image" --help >"$out/help.log" 2>&1 || fail "dray does not run in the image"
podman run --rm --network none --entrypoint sh "$image" -c 'command -v g++ || command -v bazel' >/dev/null &&
  fail "the runtime image holds the build tools"

data="$out/data"
mkdir -p "$data"
(umask 077 && openssl rand -hex 32 >"$data/token")
"$root/deploy/make-certs.sh" "$data/tls" controller node1 node2
cat >"$data/job.yaml" <<JOB
trainer: {total_steps: 2}
data: {prompts_per_step: 2}
algorithm: {group_size: 2}
worker: {rollout: {num_inference_steps: 4}}
JOB
"$dray" train --config "$data/job.yaml" trainer.save_dir="$out/plain" --workers 2 \
  >"$out/plain.log" 2>&1 || fail "the plain run failed"

DRAY_DATA="$data" DRAY_IMAGE="$image" podman-compose -p "$project" -f "$compose" up -d \
  >"$out/compose.log" 2>&1 || fail "podman-compose up failed"
for service in controller node1 node2; do
  status=$(podman wait "${project}_${service}_1") || fail "podman-compose did not create $service"
  podman logs "${project}_${service}_1" >"$out/$service.log" 2>&1
  [[ $status == 0 ]] || fail "the $service container exited with $status"
done
grep -q "^\[rank 1 node2\] dray worker: init_model" "$out/controller.log" || fail "rank 1 did not run on node2"
grep -q "node node2 (node2) attached" "$out/controller.log" || fail "node2 did not attach by its name"
cmp "$out/plain/final/pytorch_lora_weights.safetensors" \
  "$data/train/final/pytorch_lora_weights.safetensors" || fail "the adapters differ"
/usr/bin/python3 - "$out/plain/metrics.jsonl" "$data/train/metrics.jsonl" <<'PY' || fail "the metrics differ"
import json, sys
plain, contained = ([json.loads(line) for line in open(path)] for path in sys.argv[1:])
assert len(plain) == len(contained) == 2, (len(plain), len(contained))
for a, b in zip(plain, contained):
    assert {k: v for k, v in a.items() if not k.endswith("_s")} == \
           {k: v for k, v in b.items() if not k.endswith("_s")}, (a, b)
PY
echo PASS
