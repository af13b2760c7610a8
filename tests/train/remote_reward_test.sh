#!/usr/bin/env bash
# Remote rewards as a user wires them: the Python example scorer
# (examples/python/reward_server.py) drives a `dray train` run over gRPC,
# behind a bearer token and then over TLS; its score and parts land in
# metrics.jsonl. A scorer that stays down, or refuses the token, fails the
# job at start with an error naming the scorer and its address.
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
out="$TEST_TMPDIR"
fail() { echo "FAIL: $*" >&2; cat "$out"/*.log >&2 || true; exit 1; }
# wait_for_line FILE PATTERN: blocks until a line of FILE matches (tail -F
# waits for the file to exist, then follows it); false if none does within
# 2 minutes.
wait_for_line() { timeout 120 grep -q -m1 "$2" < <(tail -n +1 --pid=$$ -F "$1"); }
servers=()
trap 'for p in "${servers[@]}"; do kill $p 2>/dev/null || true; done' EXIT

# start_scorer NAME ARGS...: starts the example server; sets $port.
start_scorer() {
  local name=$1
  shift
  PYTHONPATH="$root/proto" /usr/bin/python3 "$root/examples/python/reward_server.py" --port 0 "$@" \
    >"$out/$name.log" 2>&1 &
  servers+=($!)
  wait_for_line "$out/$name.log" "listening on\|Error" || fail "the $name scorer did not start"
  port=$(sed -n 's/^listening on \([0-9]*\)$/\1/p' "$out/$name.log")
  [[ -n "$port" ]] || fail "the $name scorer did not say where it listens"
}

train() {  # train SAVE_DIR OVERRIDES...: a 2-step run of the embedded task, scored remotely only
  local dir=$1
  shift
  "$dray" train trainer.save_dir="$out/$dir" trainer.total_steps=2 data.prompts_per_step=2 \
    algorithm.group_size=2 worker.rollout.num_inference_steps=4 'worker.reward.functions=[]' \
    'worker.reward.weights=[]' "$@"
}

check_metrics() {  # check_metrics SAVE_DIR: both steps scored by "colourful", parts included
  /usr/bin/python3 - "$out/$1/metrics.jsonl" <<'PY' || fail "metrics of $1"
import json, sys
lines = [json.loads(line) for line in open(sys.argv[1])]
assert len(lines) == 2, lines
for m in lines:
    assert 0 < m["reward/colourful"] < 3, m
    assert abs(m["reward_mean"] - m["reward/colourful"]) < 1e-9, m
    assert "reward/colourful/spread" in m and "reward/colourful/strength" in m, m
PY
}

export SCORER_TOKEN=s3cret
start_scorer plain --token s3cret
train plain "worker.reward.remote=[{name: colourful, address: \"127.0.0.1:$port\", max_batch: 3, token_env: SCORER_TOKEN}]" \
  >"$out/train_plain.log" 2>&1 || fail "training against the scorer failed"
check_metrics plain

if SCORER_TOKEN=wrong train wrong_token "worker.reward.remote=[{name: colourful, address: \"127.0.0.1:$port\", token_env: SCORER_TOKEN}]" \
  >"$out/wrong_token.log" 2>&1; then
  fail "a refused token went unnoticed"
fi
grep -q "UNAUTHENTICATED: reward scorer 'colourful' at 127.0.0.1:$port" "$out/wrong_token.log" ||
  fail "unexpected error: $(tail -1 "$out/wrong_token.log")"

# TLS, with a certificate made for the test.
openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -addext subjectAltName=DNS:localhost \
  -keyout "$out/key.pem" -out "$out/cert.pem" -days 1 2>/dev/null
start_scorer tls --tls-cert "$out/cert.pem" --tls-key "$out/key.pem"
train tls "worker.reward.remote=[{name: colourful, address: \"localhost:$port\", tls_ca: \"$out/cert.pem\"}]" \
  >"$out/train_tls.log" 2>&1 || fail "training against the TLS scorer failed"
check_metrics tls

# A scorer that stays down: a port nothing listens on (the TLS server's, once stopped).
kill "${servers[-1]}"
wait "${servers[-1]}" 2>/dev/null || true
if train down "worker.reward.remote=[{name: judge, address: \"localhost:$port\", max_retries: 1, timeout_ms: 2000}]" \
  >"$out/down.log" 2>&1; then
  fail "a scorer that is down went unnoticed"
fi
grep -q "UNAVAILABLE: reward scorer 'judge' at localhost:$port: .*(after 2 attempts at most)" "$out/down.log" ||
  fail "unexpected error: $(tail -1 "$out/down.log")"
echo PASS
