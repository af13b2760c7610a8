#!/usr/bin/env bash
# `dray train` as a user runs it, with a controller that dies: a job killed
# with SIGKILL in the middle of its run (its worker processes go with it)
# and started again with trainer.resume=auto ends with the adapters of a
# run never interrupted, byte for byte, and each step in metrics.jsonl once.
# A job stopped with SIGINT (Ctrl-C) saves a checkpoint after its step,
# names it, and resumes from it to the same end.
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
out="$TEST_TMPDIR"
fail() { echo "FAIL: $*" >&2; tail -5 "$out"/*.log >&2 || true; exit 1; }
job=(trainer.total_steps=6 trainer.save_every=1 data.prompts_per_step=2 algorithm.group_size=2
  worker.rollout.num_inference_steps=4 --workers 2)

"$dray" train trainer.save_dir="$out/straight" "${job[@]}" >"$out/straight.log" 2>&1 ||
  fail "the uninterrupted run failed"

"$dray" train trainer.save_dir="$out/killed" "${job[@]}" >"$out/killed.log" 2>&1 &
controller=$!
# The event: step 2 reported, which comes after its checkpoint is written;
# four steps to go. (tail -F follows the log as it grows, once it exists.)
timeout 120 grep -q -m1 "dray train: step 2/6" < <(tail -n +1 --pid=$$ -F "$out/killed.log") ||
  fail "step 2 was not reported within 2 minutes"
[[ -f "$out/killed/checkpoints/step_000002/trainer_state.json" ]] || fail "no checkpoint of step 2"
workers=$(pgrep -P $controller) || fail "the controller has no worker processes"
kill -KILL $controller
wait $controller 2>/dev/null && fail "the controller finished before it was killed"
for pid in $workers; do  # tail --pid returns when the process is gone
  timeout 60 tail --pid=$pid -f /dev/null || fail "worker $pid outlived its controller"
done
[[ ! -d "$out/killed/final" ]] || fail "the killed run had finished"

"$dray" train trainer.save_dir="$out/killed" "${job[@]}" trainer.resume=auto >"$out/resumed.log" 2>&1 ||
  fail "the resumed run failed"
grep -q "dray train: resumed from .*/checkpoints/step_0000" "$out/resumed.log" || fail "it did not resume"
cmp "$out/straight/final/pytorch_lora_weights.safetensors" \
  "$out/killed/final/pytorch_lora_weights.safetensors" || fail "the adapters differ"
/usr/bin/python3 - "$out/straight/metrics.jsonl" "$out/killed/metrics.jsonl" <<'PY' || fail "the metrics differ"
import json, sys
straight, resumed = ([json.loads(line) for line in open(path)] for path in sys.argv[1:])
assert [m["step"] for m in resumed] == list(range(6)), [m["step"] for m in resumed]
assert [m["reward_mean"] for m in resumed] == [m["reward_mean"] for m in straight]
PY

"$dray" train trainer.save_dir="$out/interrupted" "${job[@]}" >"$out/interrupted.log" 2>&1 &
controller=$!
timeout 120 grep -q -m1 "dray train: step 1/6" < <(tail -n +1 --pid=$$ -F "$out/interrupted.log") ||
  fail "step 1 was not reported within 2 minutes"
kill -INT $controller
status=0
wait $controller || status=$?
[[ $status == 1 ]] || fail "an interrupted run exited with $status, not 1"
grep -q "stopping after this step" "$out/interrupted.log" || fail "SIGINT was not acknowledged"
grep -q "CANCELLED: stopped on request after step [1-5] of 6; checkpoint .*/interrupted/checkpoints/step_00000[1-5]: continue with trainer.resume=auto" \
  "$out/interrupted.log" || fail "the stop did not name its checkpoint"
"$dray" train trainer.save_dir="$out/interrupted" "${job[@]}" trainer.resume=auto \
  >"$out/interrupted_resumed.log" 2>&1 || fail "the run resumed after SIGINT failed"
cmp "$out/straight/final/pytorch_lora_weights.safetensors" \
  "$out/interrupted/final/pytorch_lora_weights.safetensors" || fail "the adapters differ after SIGINT"
echo PASS
