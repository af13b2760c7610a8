#!/usr/bin/env bash
# `dray train --http-port` as its users watch it: while a run trains, its
# dashboard answers /health and /api/run, its /metrics pass promtool with
# the newest step's figures, and the page in a headless Chromium (Selenium) shows the
# curves growing, the newest samples and the checkpoints; SIGTERM then stops
# the run after its step, dashboard and workers with it.
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
out="$TEST_TMPDIR"
fail() { echo "FAIL: $*" >&2; tail -20 "$out/train.log" >&2; exit 1; }
wait_for_line() { timeout 120 grep -q -m1 "$2" < <(tail -n +1 --pid=$$ -F "$1"); }

# 200 steps: far more than the checks take; SIGTERM ends it.
"$dray" train trainer.save_dir="$out/run" trainer.total_steps=200 trainer.save_every=2 \
  trainer.sample_every=2 trainer.log_every=1 data.prompts_per_step=2 algorithm.group_size=2 \
  worker.rollout.num_inference_steps=4 --workers 2 --http-port 0 >"$out/train.log" 2>&1 &
trainer=$!
trap 'kill -KILL $trainer 2>/dev/null || true' EXIT
wait_for_line "$out/train.log" "dashboard on" || fail "no dashboard"
port=$(sed -n 's|.*dashboard on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$out/train.log")
url="http://127.0.0.1:$port"
[[ $(curl -s "$url/health") == '{"status":"ok"}' ]] || fail "/health"
wait_for_line "$out/train.log" "dray train: step 2/200" || fail "step 2 was not reported"

curl -s "$url/api/run" >"$out/run.json"
/usr/bin/python3 - "$out/run.json" <<'PY' || fail "/api/run: $(head -c 300 "$out/run.json")"
import json, sys
run = json.load(open(sys.argv[1]))
assert run["total_steps"] == 200 and len(run["steps"]) >= 2, run["steps"]
assert "reward_mean" in run["steps"][-1] and "total_steps: 200" in run["config"], run["steps"][-1]
PY
curl -s "$url/metrics" >"$out/metrics.txt"
promtool check metrics <"$out/metrics.txt" >"$out/promtool.txt" 2>&1 ||
  fail "promtool check metrics: $(cat "$out/promtool.txt")"
grep -q "^dray_train_reward_mean " "$out/metrics.txt" || fail "no reward in /metrics"
grep -q "^dray_train_rollout_seconds " "$out/metrics.txt" || fail "no phase times in /metrics"
grep -q "^dray_train_restarts_total 0" "$out/metrics.txt" || fail "no restarts in /metrics"

/usr/bin/python3 "$root/tests/http/browser_dashboard.py" "$url/" \
  "${TEST_UNDECLARED_OUTPUTS_DIR:-$out}/train_page.png" || fail "the dashboard in Chromium"

workers=$(pgrep -P $trainer) || fail "dray train has no workers"
kill -TERM $trainer
wait $trainer && fail "a stopped run reported success"
grep -q "stopping after this step" "$out/train.log" || fail "SIGTERM did not stop the run after its step"
for pid in $workers; do ! kill -0 $pid 2>/dev/null || fail "worker $pid outlived dray train"; done
! curl -s "$url/health" >/dev/null || fail "the dashboard outlived dray train"
echo "PASS"
