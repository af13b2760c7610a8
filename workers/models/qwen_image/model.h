// A Qwen-Image-Edit model directory in diffusers' layout:
//
//   model_index.json                  the pipeline (QwenImageEditPipeline, or
//                                     QwenImageEditPlusPipeline for 2509/2511),
//                                     its components and their classes
//   scheduler/scheduler_config.json   FlowMatchEulerDiscreteScheduler
//   transformer/config.json           QwenImageTransformer2DModel
//   transformer/diffusion_pytorch_model.safetensors
//                                     (or *.safetensors.index.json + shards)
//   vae/config.json                   AutoencoderKLQwenImage
//   vae/diffusion_pytorch_model.safetensors
//   text_encoder/config.json          Qwen2_5_VLForConditionalGeneration
//   text_encoder/model.safetensors    (or model.safetensors.index.json + shards)
//   tokenizer/tokenizer.json          Qwen2Tokenizer (or vocab.json + merges.txt)
//   processor/preprocessor_config.json  Qwen2VLProcessor's image half
//
// Every config is read strictly and every weight checked by name and shape.
//
//   DRAY_ASSIGN_OR_RETURN(QwenImageModel model, LoadQwenImageModel("ckpt/", at::kFloat));
//   DRAY_RETURN_IF_ERROR(WriteRandomQwenImageModel("tiny/", TinyPreset(), /*seed=*/0));
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_MODEL_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_MODEL_H_

#include <cstdint>
#include <string>

#include <memory>

#include "absl/status/statusor.h"
#include "workers/models/bpe_tokenizer.h"
#include "workers/models/qwen2_vl/image_processor.h"
#include "workers/models/qwen2_vl/text_encoder.h"
#include "workers/models/qwen_image/scheduler.h"
#include "workers/models/qwen_image/transformer.h"
#include "workers/models/qwen_image/vae.h"

namespace dray::qwen_image {

// EditPipelineKind: the pipeline a model directory is made for, as its
// model_index.json's _class_name says: Qwen-Image-Edit's (one input image)
// or Edit-Plus's (Qwen-Image-Edit-2509 and -2511: one to three).
enum class EditPipelineKind { kEdit, kEditPlus };

// QwenImageModel: Qwen-Image-Edit, loaded.
struct QwenImageModel {
  EditPipelineKind pipeline = EditPipelineKind::kEdit;
  QwenImageTransformer transformer{nullptr};
  AutoencoderKLQwenImage vae{nullptr};
  FlowMatchEulerConfig scheduler;
  qwen2_vl::Qwen25VLTextEncoder text_encoder{nullptr};
  std::shared_ptr<const BpeTokenizer> tokenizer;
  qwen2_vl::ImageProcessorConfig image_processor;
};

// LoadQwenImageModel reads `dir`, building the models in `options` (dtype,
// device) and loading their weights (converted to that dtype); with
// Weights::kShapeOnly it reads only the configs and builds every model
// shape-only, for a rank that receives the weights from rank 0.
absl::StatusOr<QwenImageModel> LoadQwenImageModel(const std::string& dir, at::TensorOptions options,
                                                  Weights weights = Weights::kRead);

// ReadEditPipelineKind: the pipeline the model directory `dir` names in its
// model_index.json (checking its components as LoadQwenImageModel does).
absl::StatusOr<EditPipelineKind> ReadEditPipelineKind(const std::string& dir);

// ModelPreset: the configuration of a model directory to write.
struct ModelPreset {
  EditPipelineKind pipeline = EditPipelineKind::kEdit;
  TransformerConfig transformer;
  VaeConfig vae;
  FlowMatchEulerConfig scheduler;
  qwen2_vl::TextEncoderConfig text_encoder;  // vocab and special ids follow the tokenizer written
  qwen2_vl::ImageProcessorConfig image_processor;
  int tokenizer_merges =
      0;  // merges learned for the tokenizer written (no released vocabulary here)
};

// PresetNamed returns "tiny" (runs anywhere in seconds), "embedded" (tiny
// with the larger transformer of the embedded model, embedded_model.h, as
// an Edit-Plus pipeline),
// "small" (the real layout at reduced width) or "real" (the released sizes;
// for meta-device checks, far too large to write here). NOT_FOUND otherwise.
absl::StatusOr<ModelPreset> PresetNamed(const std::string& name);

// WriteQwenImageModelConfigs writes a model directory's every file but the
// weights: the configs and a byte-level BPE tokenizer with Qwen2's special
// tokens whose merges are learned from the edit prompt template. Returns the
// text encoder's config as written (its vocabulary follows the tokenizer).
absl::StatusOr<qwen2_vl::TextEncoderConfig> WriteQwenImageModelConfigs(const std::string& dir,
                                                                       const ModelPreset& preset);

// WriteQwen2TokenizerFiles writes `tokenizer` into `dir` as transformers'
// Qwen2Tokenizer saves itself (tokenizer.json, vocab.json, merges.txt,
// added_tokens.json, tokenizer_config.json), so that transformers' fast and
// Python tokenizers and Qwen2VLProcessor load it. Model directories carry it
// in tokenizer/ and processor/.
absl::Status WriteQwen2TokenizerFiles(const std::string& dir, const BpeTokenizer& tokenizer);

// WriteRandomQwenImageModel writes those files and PyTorch-default random
// weights (float32), deterministic for `seed`.
absl::Status WriteRandomQwenImageModel(const std::string& dir, const ModelPreset& preset,
                                       uint64_t seed);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_MODEL_H_
