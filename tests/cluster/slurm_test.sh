#!/usr/bin/env bash
# deploy/slurm/dray.sbatch on a real Slurm: slurmctld here and two slurmd
# "nodes", each in a network namespace of its own with its own hostname
# (netns_hosts.sh), munge for authentication. `sbatch -N 2 --wait` runs a
# dray train job there with the cluster token and mutual TLS, which must
# match the same job run with --workers 2 on one machine; then a dray serve
# job answers an edit as a local dray edit does, and `scancel --batch
# --signal=TERM` stops it cleanly, with all its processes. Needs root and Debian's slurm-wlm
# (deploy/install-deps.sh); skips without root.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
  echo "SKIPPED: needs root (slurmd in network namespaces)"
  exit 0
fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
hosts="$root/tests/cluster/netns_hosts.sh"
sbatch_script="$root/deploy/slurm/dray.sbatch"
out="$TEST_TMPDIR"
name=drsl  # one name per subnet: a run cleans up what a killed run left
exec 9>"/run/lock/dray-$name.lock" && flock 9  # and waits for one still running
subnet=10.77.33
# Slurm's own files, under a short path: its unix sockets live there.
slurm=$(mktemp -d /tmp/drsl.XXXXXX)
fail() { echo "FAIL: $*" >&2; tail -n 20 "$out"/*.log "$out"/*.out "$slurm"/*.log >&2 || true; exit 1; }
export SLURM_CONF="$slurm/slurm.conf"
munged_pid=""
cleanup() {
  scancel --full --signal=KILL --partition=dray 2>/dev/null || true
  for pid_file in "$slurm"/slurm*.pid; do
    [[ -s $pid_file ]] && kill -KILL "$(cat "$pid_file")" 2>/dev/null || true
  done
  [[ -n $munged_pid ]] && kill "$munged_pid" 2>/dev/null || true
  "$hosts" down "$name" 2
  rm -rf "$slurm"
}
trap cleanup EXIT
"$hosts" up "$name" 2 "$subnet"

if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge && chown munge: /run/munge
  runuser -u munge -- /usr/sbin/munged
  munged_pid=$(pgrep -x munged)
fi
mkdir -p "$slurm/state" "$slurm/spool/node1" "$slurm/spool/node2"
cpus=$(nproc)
cat >"$SLURM_CONF" <<CONF
ClusterName=dray-test
SlurmctldHost=$(hostname -s)($subnet.1)
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$slurm/state
SlurmctldPidFile=$slurm/slurmctld.pid
SlurmctldLogFile=$slurm/slurmctld.log
SlurmdSpoolDir=$slurm/spool/%n
SlurmdPidFile=$slurm/slurmd.%n.pid
SlurmdLogFile=$slurm/slurmd.%n.log
NodeName=node1 NodeHostname=node1 NodeAddr=$subnet.11 CPUs=$cpus State=UNKNOWN
NodeName=node2 NodeHostname=node2 NodeAddr=$subnet.12 CPUs=$cpus State=UNKNOWN
PartitionName=dray Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld
for i in 1 2; do
  nsenter --net="/run/netns/$name$i" unshare --uts sh -c "hostname node$i && exec slurmd -N node$i"
done
# The controller says when it serves; the job then waits (pending) until
# both slurmd have registered.
timeout 120 grep -q -m1 "Running as primary controller" < <(tail -n +1 --pid=$$ -F "$slurm/slurmctld.log") ||
  fail "slurmctld did not start"

# A certificate authority and one certificate naming both nodes' addresses.
"$root/deploy/make-certs.sh" "$out/tls" "$subnet.11" "$subnet.12"
export DRAY="$dray" DRAY_TOKEN_FILE="$out/token" DRAY_PORT=$((29400 + $$ % 1000)) \
  DRAY_TLS_CERT="$out/tls/tls.crt" DRAY_TLS_KEY="$out/tls/tls.key" DRAY_TLS_CA="$out/tls/ca.crt" \
  DRAY_TLS_MUTUAL=1

job=(trainer.total_steps=2 data.prompts_per_step=2 algorithm.group_size=2
  worker.rollout.num_inference_steps=4)
"$dray" train trainer.save_dir="$out/local" "${job[@]}" --workers 2 >"$out/local.log" 2>&1 ||
  fail "the one-machine run failed"
timeout 600 sbatch -N 2 --wait --no-requeue --output="$out/job.out" "$sbatch_script" \
  train trainer.save_dir="$out/slurm" "${job[@]}" >"$out/sbatch.log" 2>&1 ||
  fail "the Slurm job failed"
grep -q "^\[rank 1 node2\] dray worker: init_model" "$out/job.out" || fail "rank 1 did not run on node2"
[[ $(stat -c %a "$out/token") == 600 ]] || fail "the token file is readable by others"
cmp "$out/local/final/pytorch_lora_weights.safetensors" \
  "$out/slurm/final/pytorch_lora_weights.safetensors" || fail "the adapters differ"

# dray serve on the two nodes, on the first node's address, until scancel.
edit=(--image "$root/docs/scene.png" --instruction "make it purple" --seed 3)
"$dray" edit "${edit[@]}" --out "$out/local.png" >"$out/edit.log" 2>&1 || fail "dray edit failed"
openssl rand -hex 16 >"$out/client_token"
port=$((DRAY_PORT + 1))
sbatch -N 2 --wait --no-requeue --output="$out/serve.out" "$sbatch_script" \
  serve --port "$port" --client-token-file "$out/client_token" >"$out/sbatch-serve.log" 2>&1 &
sbatch_wait=$!
timeout 300 grep -q -m1 "ImageEditService on" < <(tail -n +1 --pid=$$ -F "$out/serve.out") ||
  fail "dray serve did not start"
grep -q "with 2 nodes x 1 worker" "$out/serve.out" || fail "the service is not on both nodes"
"$dray" edit "${edit[@]}" --server "$subnet.11:$port" --tls-ca "$out/tls/ca.crt" \
  --tls-cert "$out/tls/tls.crt" --tls-key "$out/tls/tls.key" --token-file "$out/client_token" --out "$out/served.png" \
  >"$out/served.log" 2>&1 || fail "the edit through the service failed"
cmp "$out/local.png" "$out/served.png" || fail "the served image differs from the local one"
# The clean stop the script documents: TERM to the controller alone.
scancel --batch --signal=TERM --partition=dray
wait "$sbatch_wait" || fail "the serve job did not end cleanly"
grep -q "^dray serve: stopped" "$out/serve.out" || fail "dray serve did not drain and stop"
for i in 1 2; do
  for pid in $(ip netns pids "$name$i"); do
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$dray" && fail "a dray process outlived the job"
  done
done
echo PASS
