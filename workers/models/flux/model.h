// A FLUX.1 Kontext model directory in diffusers' layout:
//
//   model_index.json                  FluxKontextPipeline, its components
//   scheduler/scheduler_config.json   FlowMatchEulerDiscreteScheduler
//   transformer/config.json           FluxTransformer2DModel
//   transformer/diffusion_pytorch_model.safetensors  (or an index + shards)
//   vae/config.json                   AutoencoderKL
//   vae/diffusion_pytorch_model.safetensors
//   text_encoder/                     CLIPTextModel (config.json, model.safetensors)
//   text_encoder_2/                   T5EncoderModel (config.json, safetensors or index + shards)
//   tokenizer/                        CLIPTokenizer (vocab.json, merges.txt)
//   tokenizer_2/                      T5Tokenizer(Fast) (spiece.model)
//
// Every config is read strictly and every weight checked by name and shape.
//
//   DRAY_ASSIGN_OR_RETURN(FluxKontextModel model, LoadFluxKontextModel("ckpt/", at::kFloat));
//   DRAY_RETURN_IF_ERROR(WriteRandomFluxKontextModel("tiny/", FluxTinyPreset(), /*seed=*/0));
#ifndef DRAY_WORKERS_MODELS_FLUX_MODEL_H_
#define DRAY_WORKERS_MODELS_FLUX_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/models/clip/text_encoder.h"
#include "workers/models/clip/tokenizer.h"
#include "workers/models/flux/transformer.h"
#include "workers/models/flux/vae.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/scheduler.h"
#include "workers/models/t5/encoder.h"
#include "workers/models/t5/tokenizer.h"

namespace dray::flux {

// FluxKontextModel: FLUX.1 Kontext, loaded.
struct FluxKontextModel {
  FluxTransformer transformer{nullptr};
  AutoencoderKL vae{nullptr};
  qwen_image::FlowMatchEulerConfig scheduler;
  clip::ClipTextModel clip{nullptr};
  t5::T5Encoder t5{nullptr};
  std::shared_ptr<const clip::Tokenizer> clip_tokenizer;
  std::shared_ptr<const t5::Tokenizer> t5_tokenizer;
};

// LoadFluxKontextModel reads `dir`, building the models in `options` and
// loading their weights (converted to that dtype); with Weights::kShapeOnly
// it reads only the configs and builds every model shape-only.
absl::StatusOr<FluxKontextModel> LoadFluxKontextModel(const std::string& dir,
                                                      at::TensorOptions options,
                                                      Weights weights = Weights::kRead);

// FluxPreset: the configuration of a model directory to write.
struct FluxPreset {
  FluxTransformerConfig transformer;
  AutoencoderKLConfig vae;
  qwen_image::FlowMatchEulerConfig scheduler;
  clip::ClipTextConfig clip;
  t5::T5EncoderConfig t5;
};

// FluxPresetNamed returns "flux-tiny" (runs anywhere in seconds: the
// reference vectors' tiny sizes) or "flux-real" (FLUX.1 Kontext [dev]'s
// sizes, for meta-device checks and memory plans); NOT_FOUND otherwise.
absl::StatusOr<FluxPreset> FluxPresetNamed(const std::string& name);

// WriteRandomFluxKontextModel writes a model directory of `preset` with
// PyTorch-default random weights (float32), deterministic for `seed`, and
// dray's tiny tokenizers (a CLIP BPE vocabulary and a T5 SentencePiece
// model made by transformers and sentencepiece; tokenizers are not random).
absl::Status WriteRandomFluxKontextModel(const std::string& dir, const FluxPreset& preset,
                                         uint64_t seed);

}  // namespace dray::flux

#endif  // DRAY_WORKERS_MODELS_FLUX_MODEL_H_
