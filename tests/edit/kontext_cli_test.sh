#!/usr/bin/env bash
# FLUX.1 Kontext as a user runs it, chosen by the model directory alone:
# `dray init-model --preset flux-tiny` writes one; `dray edit --model` runs
# it on one worker, on two, and sharded over two (FULL_SHARD: the same
# image); `dray serve` with that model_path answers the Python client and
# `dray edit --server` with the same image for the same seed and guidance;
# `dray train` fine-tunes it (SFT, flow_grpo's LoRA) into adapters that
# `dray edit --lora` applies; what Kontext does not run (CFG parallelism,
# VAE training) is refused with errors naming why.
set -euo pipefail

root="$TEST_SRCDIR/$TEST_WORKSPACE"
dray="$root/cli/dray"
image="$root/docs/example.png"
out="$TEST_TMPDIR"
model="$out/flux-tiny"
fail() { echo "FAIL: $*" >&2; cat "$out/serve.log" 2>/dev/null >&2 || true; exit 1; }
wait_for_line() { timeout 120 grep -q -m1 "$2" < <(tail -n +1 --pid=$$ -F "$1"); }

"$dray" init-model --preset flux-tiny --out "$model" | grep -q "FLUX.1 Kontext" || fail "init-model"
grep -q '"_class_name": "FluxKontextPipeline"' "$model/model_index.json" || fail "model_index.json"

edit() { # edit OUT ARGS...: a small local Kontext edit
  local target=$1
  shift
  "$dray" edit --model "$model" --image "$image" --instruction "add a red hat" --seed 5 --steps 3 \
    --image-size 64 --guidance-scale 2.5 --out "$target" "$@" 2>"$target.log" || fail "edit $*: $(cat "$target.log")"
}
edit "$out/one.png"
grep -q "num_inference_steps: 3" "$out/one.png.log" || fail "the resolved configuration was not printed"
grep -q "guidance_scale: 2.5" "$out/one.png.log" || fail "guidance_scale was not applied"
grep -q "denoising: step 3/3" "$out/one.png.log" || fail "no progress was shown"
edit "$out/two.png" --workers 2
cmp "$out/one.png" "$out/two.png" || fail "two workers edited differently"
edit "$out/sharded.png" --workers 2 worker.image_edit.enable_fsdp=true
cmp "$out/one.png" "$out/sharded.png" || fail "FULL_SHARD over two workers edited differently"
edit "$out/guided.png" --true-cfg-scale 2 --negative-prompt "blurry"
if cmp -s "$out/one.png" "$out/guided.png"; then fail "true CFG changed nothing"; fi

if "$dray" edit --model "$model" --image "$image" --instruction x --out "$out/never.png" --workers 2 \
  --cfg-parallel-size 2 2>"$out/cfg.txt"; then
  fail "CFG parallelism was accepted for Kontext"
fi
grep -q "UNIMPLEMENTED.*FLUX.1 Kontext, whose edits run on one rank each" "$out/cfg.txt" ||
  fail "unexpected error: $(cat "$out/cfg.txt")"

small_job=(worker.image_edit.model_path="$model" worker.rollout.resolution=64 data.prompts_per_step=2 algorithm.group_size=2
  worker.rollout.num_inference_steps=3 trainer.total_steps=1)
"$dray" train algorithm.name=sft "${small_job[@]}" trainer.save_dir="$out/sft" \
  >"$out/sft.txt" 2>&1 || fail "dray train sft: $(tail -3 "$out/sft.txt")"
grep -q "lora_rank: 64" "$out/sft/config.yaml" || fail "flow_grpo's Kontext LoRA was not the default"
edit "$out/tuned.png" --lora "$out/sft/final/pytorch_lora_weights.safetensors"
if cmp -s "$out/one.png" "$out/tuned.png"; then fail "the trained adapters changed nothing"; fi
if "$dray" train algorithm.name=vae "${small_job[@]}" >/dev/null 2>"$out/train.txt"; then
  fail "training Kontext's VAE was accepted"
fi
grep -q "UNIMPLEMENTED.*FLUX.1 Kontext: dray trains it with SFT" "$out/train.txt" ||
  fail "unexpected error: $(tail -2 "$out/train.txt")"

(
  exec "$dray" serve --workers 1 --port 0 worker.image_edit.model_path="$model" \
    worker.image_edit.num_inference_steps=3 \
    worker.image_edit.image_size=64
) >"$out/serve.log" 2>&1 &
server=$!
trap 'kill -KILL $server 2>/dev/null || true' EXIT
wait_for_line "$out/serve.log" "ImageEditService on\|^dray serve: " || fail "dray serve did not start"
port=$(sed -n 's/.*ImageEditService on [^ ]*:\([0-9][0-9]*\) .*/\1/p' "$out/serve.log")
[[ -n "$port" ]] || fail "dray serve did not say where it listens"
grep -q "guidance_scale: 3.5" "$out/serve.log" || fail "the server did not take Kontext's defaults"

# A NaN guidance is refused at admission (it once wedged the server's batching).
if "$dray" edit --server "127.0.0.1:$port" --image "$image" --instruction x --guidance-scale nan \
  --timeout 60 --out "$out/never.png" 2>"$out/nan.txt"; then
  fail "a NaN guidance_scale was accepted"
fi
grep -q "INVALID_ARGUMENT.*guidance_scale must lie in \[0, 100\], got nan" "$out/nan.txt" ||
  fail "unexpected error: $(cat "$out/nan.txt")"
PYTHONPATH="$root/proto" /usr/bin/python3 "$root/examples/python/edit_client.py" --server "127.0.0.1:$port" \
  --image "$image" --instruction "add a red hat" --seed 5 --guidance-scale 2.5 --out "$out/python.png" >/dev/null
"$dray" edit --server "127.0.0.1:$port" --image "$image" --instruction "add a red hat" --seed 5 \
  --guidance-scale 2.5 --out "$out/cli.png" 2>/dev/null
cmp "$out/python.png" "$out/cli.png" || fail "the Python client and dray edit --server differ"
cmp "$out/one.png" "$out/cli.png" || fail "the server edited differently from the local worker"
kill -TERM $server
wait $server || true
echo PASS
