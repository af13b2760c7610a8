#!/bin/bash
# Trains the embedded model from random weights with dray itself and packs
# it into workers/models/qwen_image/embedded/tiny_edit.safetensors (what the
# dray binary carries). About 70 minutes on 2 CPU cores.
#
#   tools/train_embedded_model.sh [WORK_DIR]     (default /tmp/dray-embedded)
#
# 1. synthetic pairs: 512 scenes (seeds 1000..1511; tests hold out seeds
#    below 1000), each with the target of every synthetic instruction and
#    with the sky of each of 4 donor scenes (two pictures in); and the same
#    scenes at three sizes (64x64, 48x80, 80x48)
# 2. the VAE as a plain autoencoder of the scenes and their targets
#    (vae.yaml), on the embedded preset's random start
# 3. the VAE rounded to float16, as it ships, so that the transformer
#    learns on the latents it will see
# 4. the transformer, fully fine-tuned with SFT on the square pairs
#    (sft.yaml), then on the pairs of three sizes at a fifth of the
#    learning rate (sft_sizes.yaml)
# 5. the trained components packed, and scored on held-out scenes
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/dray-embedded}
configs=tools/embedded_model
bazel build //cli:dray //tools:synthetic_edit_pairs //tools:embedded_model
dray=bazel-bin/cli/dray
embedded_model=bazel-bin/tools/embedded_model

rm -rf "$work" && mkdir -p "$work"
bazel-bin/tools/synthetic_edit_pairs --out "$work/pairs" --scenes 512 --first-seed 1000 \
    --sky-donors 4
bazel-bin/tools/synthetic_edit_pairs --out "$work/pairs_sizes" --scenes 512 --first-seed 1000 \
    --sizes 64x64,48x80,80x48 --sky-donors 4
"$dray" init-model --preset embedded --seed 0 --out "$work/random"
"$dray" train --config "$configs/vae.yaml" worker.image_edit.model_path="$work/random" \
    data.train_files="$work/pairs/train.jsonl" trainer.save_dir="$work/vae"
"$embedded_model" pack --model "$work/vae/final" --out "$work/vae.safetensors"
"$embedded_model" unpack --weights "$work/vae.safetensors" --out "$work/vae_model"
"$dray" train --config "$configs/sft.yaml" worker.image_edit.model_path="$work/vae_model" \
    data.train_files="$work/pairs/train.jsonl" trainer.save_dir="$work/sft"
"$dray" train --config "$configs/sft_sizes.yaml" worker.image_edit.model_path="$work/sft/final" \
    data.train_files="$work/pairs_sizes/train.jsonl" trainer.save_dir="$work/sft_sizes"
"$embedded_model" pack --model "$work/sft_sizes/final" \
    --out workers/models/qwen_image/embedded/tiny_edit.safetensors
"$embedded_model" score --model "$work/sft_sizes/final"
"$embedded_model" score --model "$work/sft_sizes/final" --height 48 --width 80
echo "packed; curves and samples: $work/{vae,sft,sft_sizes}; check: bazel test //tests/train:embedded_model_test"
