#!/bin/bash
# Distils the embedded model with dray's own DMD2 into few-step editors and
# ships them: the generators' LoRAs in workers/models/qwen_image/embedded/
# (dmd2_4step_lora.safetensors, dmd2_1step_lora.safetensors) and their
# comparisons with the teacher in docs/ (dmd2_4step.png, dmd2_1step.png).
# About 3 minutes on 2 CPU cores.
#
#   tools/distil_embedded_model.sh [WORK_DIR]     (default /tmp/dray-dmd2)
#
# The teacher is the embedded model guided (true CFG 4, negative prompt " ",
# 20 steps: 40 transformer passes an edit); each generator edits unguided in
# 4 steps (4 passes) or 1. `dray train algorithm.name=dmd2` on the embedded
# task (its defaults: 300 steps, the model's own training scenes), then
# `embedded_model compare` on held-out scenes: each setting's passes, edit
# score, PSNR to the teacher's edits and seconds per edit.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/dray-dmd2}
bazel build //cli:dray //tools:embedded_model
shipped=workers/models/qwen_image/embedded

rm -rf "$work" && mkdir -p "$work"
for steps in 4 1; do
  bazel-bin/cli/dray train algorithm.name=dmd2 algorithm.num_denoising_step="$steps" \
      trainer.save_dir="$work/dmd2_${steps}step" >"$work/train_${steps}step.log" 2>&1
  cp "$work/dmd2_${steps}step/final/pytorch_lora_weights.safetensors" \
      "$shipped/dmd2_${steps}step_lora.safetensors"
  bazel-bin/tools/embedded_model compare --lora "$shipped/dmd2_${steps}step_lora.safetensors" \
      --steps "$steps" --grid "docs/dmd2_${steps}step.png"
done
