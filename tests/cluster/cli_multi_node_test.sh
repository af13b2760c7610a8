#!/usr/bin/env bash
# `dray train` and `dray serve` as a cluster runs them, on two hosts made of
# network namespaces (netns_hosts.sh; needs root, skips without it): a
# `dray node` agent on each host, the controller here with --nodes 2
# --listen and a cluster token. Trained with mutual TLS on every port, the
# adapters and metrics equal a one-machine run's byte for byte (and an agent
# without TLS cannot attach). A node killed mid-run is replaced and the run,
# restarted from its last checkpoint (trainer.max_restarts), ends with a
# straight run's adapters. DMD2's three models placed across the nodes
# (the fake score HYBRID_SHARD: sharded within a node, replicated across
# them) train the weights of one machine's run. An image edited through the multi-node service
# (on TLS, asking clients for a bearer token; from dray edit and the Python
# client) equals one edited locally.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "SKIPPED: needs root (network namespaces stand in for hosts)"
  exit 0
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
hosts="$root/tests/cluster/netns_hosts.sh"
out="$TEST_TMPDIR"
name=drcl  # one name per subnet: a run cleans up what a killed run left
exec 9>"/run/lock/dray-$name.lock" && flock 9  # and waits for one still running
subnet=10.77.32
fail() { echo "FAIL: $*" >&2; tail -n 5 "$out"/*.log >&2 || true; exit 1; }
# wait_for_line FILE PATTERN: blocks until a line of FILE matches.
wait_for_line() { timeout 120 grep -q -m1 "$2" < <(tail -n +1 --pid=$$ -F "$1"); }
agents=()
cleanup() {
  kill -KILL "${agents[@]}" ${server:-} 2>/dev/null || true
  "$hosts" down "$name" 2
}
trap cleanup EXIT
"$hosts" up "$name" 2 "$subnet"
openssl rand -hex 32 >"$out/token"
# A certificate authority and one certificate for every host's address; and
# ImageEditService's own, from another authority, for the name its clients dial.
"$root/deploy/make-certs.sh" "$out/tls" "$subnet.1" "$subnet.11" "$subnet.12" 127.0.0.1
"$root/deploy/make-certs.sh" "$out/public" localhost
tls=(--tls-cert "$out/tls/tls.crt" --tls-key "$out/tls/tls.key" --tls-ca "$out/tls/ca.crt")
mutual_tls=("${tls[@]}" --tls-mutual)

# pool_address LOG: where the controller whose LOG this is waits for nodes.
pool_address() {
  wait_for_line "$1" "waiting for 2 nodes to attach at" || fail "no node pool in $1"
  sed -n 's/.*waiting for 2 nodes to attach at \([0-9.:]*\).*/\1/p' "$1" | head -1
}
# agent I ARGS...: `dray node ARGS` on host I, as nodeI.
agent() {
  local i=$1
  shift
  nsenter --net="/run/netns/$name$i" unshare --uts sh -c "hostname node$i && exec \"\$0\" \"\$@\"" \
    "$dray" node --token-file="$out/token" "$@"
}
# start_agents LOG [ARGS...]: an agent on each host for the controller of LOG.
start_agents() {
  local address
  address=$(pool_address "$1")
  shift
  agents=()
  for i in 1 2; do
    agent $i --controller="$address" "$@" >"$out/agent$i.log" 2>&1 &
    agents+=($!)
  done
}
# kill_agent I: SIGKILL the `dray node` of host I (its workers die with it).
kill_agent() {
  local pid
  for pid in $(ip netns pids "$name$1"); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q " node "; then kill -KILL "$pid"; fi
  done
}
cluster=(--nodes 2 --workers 1 --listen "$subnet.1:0" --token-file "$out/token")

job=(trainer.total_steps=2 data.prompts_per_step=2 algorithm.group_size=2
  worker.rollout.num_inference_steps=4)
"$dray" train trainer.save_dir="$out/local" "${job[@]}" --workers 2 >"$out/local.log" 2>&1 ||
  fail "the one-machine run failed"
# The cluster and its TLS from the configuration file's keys, not flags.
cat >"$out/cluster.yaml" <<YAML
cluster:
  nodes: 2
  listen: $subnet.1:0
  token_file: $out/token
  tls_cert: $out/tls/tls.crt
  tls_key: $out/tls/tls.key
  tls_ca: $out/tls/ca.crt
  tls_mutual: true
YAML
"$dray" train --config "$out/cluster.yaml" trainer.save_dir="$out/nodes" "${job[@]}" --workers 1 \
  >"$out/nodes.log" 2>&1 &
controller=$!
agent 1 --controller="$(pool_address "$out/nodes.log")" --attach-timeout-s 2 >"$out/plain.log" 2>&1 &&
  fail "an agent without TLS attached"
grep -q "could not reach the controller" "$out/plain.log" || fail "the plaintext agent's error: $(cat "$out/plain.log")"
start_agents "$out/nodes.log" "${mutual_tls[@]}"
wait $controller || fail "the multi-node run failed"
for agent in "${agents[@]}"; do wait "$agent" || fail "an agent did not stop cleanly"; done
grep -q "^\[rank 1 node2\] dray worker: init_model" "$out/nodes.log" || fail "rank 1's output did not come from node2"
cmp "$out/local/final/pytorch_lora_weights.safetensors" \
  "$out/nodes/final/pytorch_lora_weights.safetensors" || fail "the adapters differ"
/usr/bin/python3 - "$out/local/metrics.jsonl" "$out/nodes/metrics.jsonl" <<'PY' || fail "the metrics differ"
import json, sys
local, nodes = ([json.loads(line) for line in open(path)] for path in sys.argv[1:])
for a, b in zip(local, nodes):
    assert {k: v for k, v in a.items() if not k.endswith("_s")} == \
           {k: v for k, v in b.items() if not k.endswith("_s")}, (a, b)
PY

job=(trainer.total_steps=40 trainer.save_every=1 trainer.max_restarts=1 data.prompts_per_step=2
  algorithm.group_size=2 worker.rollout.num_inference_steps=4)
"$dray" train trainer.save_dir="$out/straight" "${job[@]}" --workers 2 >"$out/straight.log" 2>&1 ||
  fail "the straight run failed"
"$dray" train trainer.save_dir="$out/restarted" "${job[@]}" "${cluster[@]}" >"$out/restarted.log" 2>&1 &
controller=$!
start_agents "$out/restarted.log"
wait_for_line "$out/restarted.log" "dray train: step 2/40" || fail "step 2 was not reported"
kill_agent 2
agent 2 --controller="$(pool_address "$out/restarted.log")" >"$out/replacement.log" 2>&1 &
agents+=($!)
wait $controller || fail "the run with a lost node failed"
for agent in "${agents[@]}"; do wait "$agent" || true; done
grep -q "node node2 ($subnet.12) was lost" "$out/restarted.log" || fail "the node's loss was not reported"
grep -q "dray train: restart 1 of 1" "$out/restarted.log" || fail "the group was not restarted"
grep -q "dray train: resumed from .*/checkpoints/step_0000" "$out/restarted.log" || fail "no resume"
cmp "$out/straight/final/pytorch_lora_weights.safetensors" \
  "$out/restarted/final/pytorch_lora_weights.safetensors" || fail "the restarted run's adapters differ"

# DMD2, the generator trained whole: its real score a SHARD_GRAD_OP copy,
# its fake score HYBRID_SHARD, on two nodes and on one machine.
job=(algorithm.name=dmd2 worker.actor.lora_rank=0 algorithm.dfake_gen_update_ratio=1
  algorithm.real_score.fsdp_sharding_strategy=SHARD_GRAD_OP
  algorithm.fake_score.fsdp_sharding_strategy=HYBRID_SHARD trainer.total_steps=2
  data.prompts_per_step=2 trainer.sample_every=1000)
"$dray" train trainer.save_dir="$out/dmd2_local" "${job[@]}" --workers 2 >"$out/dmd2_local.log" 2>&1 ||
  fail "DMD2 on one machine failed"
"$dray" train trainer.save_dir="$out/dmd2_nodes" "${job[@]}" "${cluster[@]}" >"$out/dmd2_nodes.log" 2>&1 &
controller=$!
start_agents "$out/dmd2_nodes.log"
wait $controller || fail "DMD2 on two nodes failed"
for agent in "${agents[@]}"; do wait "$agent" || fail "an agent did not stop cleanly"; done
cmp "$out/dmd2_local/final/transformer/diffusion_pytorch_model.safetensors" \
  "$out/dmd2_nodes/final/transformer/diffusion_pytorch_model.safetensors" ||
  fail "DMD2's generator differs across nodes"

edit=(--instruction "make it purple" --seed 3)
"$dray" edit --image "$root/docs/scene.png" "${edit[@]}" --out "$out/local.png" >"$out/edit.log" 2>&1 ||
  fail "dray edit failed"
openssl rand -hex 16 >"$out/client_token"
"$dray" serve --port 0 "${cluster[@]}" "${mutual_tls[@]}" --client-token-file "$out/client_token" \
  --public-tls-cert "$out/public/tls.crt" --public-tls-key "$out/public/tls.key" >"$out/serve.log" 2>&1 &
server=$!
start_agents "$out/serve.log" "${mutual_tls[@]}"
wait_for_line "$out/serve.log" "ImageEditService on" || fail "dray serve did not start"
port=$(sed -n 's/.*ImageEditService on [0-9.]*:\([0-9]*\).*/\1/p' "$out/serve.log")
grep -q "with 2 nodes x 1 worker" "$out/serve.log" || fail "the service does not say where its workers are"
# Clients trust the service's own certificate and show none of their own,
# though the cluster runs mutual TLS.
to_service=(--server "localhost:$port" --image "$root/docs/scene.png" "${edit[@]}")
"$dray" edit "${to_service[@]}" --tls-ca "$out/tls/ca.crt" --token-file "$out/client_token" \
  --out "$out/refused.png" --timeout 5 >"$out/untrusted.log" 2>&1 &&
  fail "a client that trusts only the cluster's authority accepted the service's certificate"
served=("${to_service[@]}" --tls-ca "$out/public/ca.crt")
"$dray" edit "${served[@]}" --out "$out/refused.png" >"$out/refused.log" 2>&1 &&
  fail "an edit without the client token was served"
grep -q "UNAUTHENTICATED" "$out/refused.log" || fail "no token: $(cat "$out/refused.log")"
"$dray" edit "${served[@]}" --token-file "$out/client_token" --out "$out/served.png" \
  >"$out/served.log" 2>&1 || fail "the edit through the service failed"
PYTHONPATH="$root/proto" /usr/bin/python3 "$root/examples/python/edit_client.py" "${served[@]}" \
  --token-file "$out/client_token" --out "$out/python.png" >"$out/python.log" 2>&1 ||
  fail "the Python client's edit failed"
cmp "$out/served.png" "$out/python.png" || fail "the Python client got another image"
cmp "$out/local.png" "$out/served.png" || fail "the served image differs from the local one"
kill -TERM $server
wait $server || fail "dray serve did not stop cleanly"
for agent in "${agents[@]}"; do wait "$agent" || fail "an agent did not stop cleanly"; done
echo PASS
