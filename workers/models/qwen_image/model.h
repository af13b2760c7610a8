// A Qwen-Image-Edit model directory in diffusers' layout:
//
//   model_index.json                  components and their classes
//   scheduler/scheduler_config.json   FlowMatchEulerDiscreteScheduler
//   transformer/config.json           QwenImageTransformer2DModel
//   transformer/diffusion_pytorch_model.safetensors
//                                     (or *.safetensors.index.json + shards)
//   vae/config.json                   AutoencoderKLQwenImage
//   vae/diffusion_pytorch_model.safetensors
//
// (text_encoder/ and tokenizer/ belong to the text-encoder half.) Every
// config is read strictly and every weight checked by name and shape.
//
//   DRAY_ASSIGN_OR_RETURN(QwenImageModel model, LoadQwenImageModel("ckpt/", at::kFloat));
//   DRAY_RETURN_IF_ERROR(WriteRandomQwenImageModel("tiny/", TinyPreset(), /*seed=*/0));
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_MODEL_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "workers/models/qwen_image/scheduler.h"
#include "workers/models/qwen_image/transformer.h"
#include "workers/models/qwen_image/vae.h"

namespace dray::qwen_image {

// QwenImageModel: the diffusion half of Qwen-Image-Edit, loaded.
struct QwenImageModel {
  QwenImageTransformer transformer{nullptr};
  AutoencoderKLQwenImage vae{nullptr};
  FlowMatchEulerConfig scheduler;
};

// LoadQwenImageModel reads `dir`, building the models in `options` (dtype,
// device) and loading their weights (converted to that dtype).
absl::StatusOr<QwenImageModel> LoadQwenImageModel(const std::string& dir, at::TensorOptions options);

// ModelPreset: the configuration of a model directory to write.
struct ModelPreset {
  TransformerConfig transformer;
  VaeConfig vae;
  FlowMatchEulerConfig scheduler;
};

// PresetNamed returns "tiny" (runs anywhere in seconds), "small" (the
// real layout at reduced width) or "real" (the released sizes; for
// meta-device checks, far too large to write here). NOT_FOUND otherwise.
absl::StatusOr<ModelPreset> PresetNamed(const std::string& name);

// WriteRandomQwenImageModel writes a model directory with PyTorch-default
// random weights (float32), deterministic for `seed`.
absl::Status WriteRandomQwenImageModel(const std::string& dir, const ModelPreset& preset, uint64_t seed);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_MODEL_H_
