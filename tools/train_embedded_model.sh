#!/bin/bash
# Trains the embedded model from random weights with dray itself and packs
# it into workers/models/qwen_image/embedded/tiny_edit.safetensors (what the
# dray binary carries). About 75 minutes on 2 CPU cores.
#
#   tools/train_embedded_model.sh [WORK_DIR]     (default /tmp/dray-embedded)
#
# 1. synthetic pairs: 512 scenes (seeds 1000..1511; tests hold out seeds
#    below 1000), each with the target of every synthetic instruction
# 2. the VAE as an autoencoder of the scenes and the targets (vae.yaml),
#    then 500 more steps at a fifth of the learning rate
# 3. the VAE rounded to float16, as it ships, so that the transformer
#    learns on the latents it will see
# 4. the transformer, fully fine-tuned with SFT on the pairs (sft.yaml)
# 5. the trained components packed
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/dray-embedded}
configs=tools/embedded_model
bazel build //cli:dray //tools:synthetic_edit_pairs //tools:embedded_model
dray=bazel-bin/cli/dray
embedded_model=bazel-bin/tools/embedded_model

rm -rf "$work" && mkdir -p "$work"
bazel-bin/tools/synthetic_edit_pairs --out "$work/pairs" --scenes 512 --first-seed 1000
"$dray" init-model --preset tiny --seed 0 --out "$work/random"
vae=(--config "$configs/vae.yaml" worker.image_edit.model_path="$work/random"
  data.train_files="$work/pairs/train.jsonl" trainer.save_dir="$work/vae")
"$dray" train "${vae[@]}"                    # 1500 steps at LR 2e-3
"$dray" train "${vae[@]}" trainer.resume=auto trainer.total_steps=2000 worker.actor.lr=0.0004
"$embedded_model" pack --model "$work/vae/final" --out "$work/vae.safetensors"
"$embedded_model" unpack --weights "$work/vae.safetensors" --out "$work/vae_model"
"$dray" train --config "$configs/sft.yaml" worker.image_edit.model_path="$work/vae_model" \
    data.train_files="$work/pairs/train.jsonl" trainer.save_dir="$work/sft"
"$embedded_model" pack --model "$work/sft/final" \
    --out workers/models/qwen_image/embedded/tiny_edit.safetensors
echo "packed; curves and samples: $work/vae and $work/sft; check: bazel test //tests/train:embedded_model_test"
