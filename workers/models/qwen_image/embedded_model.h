// The embedded model: Qwen-Image-Edit's "embedded" preset (tiny, with a
// larger transformer) trained by dray itself (tools/train_embedded_model.sh:
// the VAE as an autoencoder, then the transformer with SFT, on synthetic
// scenes of about 64^2 pixels) to make simple colour and brightness edits:
// "make it purple", "make it darker", "turn the sky red"
// (workers/train/train_data.h lists them). Its weights are linked into the
// binary; WriteEmbeddedModel unpacks them into a model directory, so every
// command that runs without a model path edits for real.
//
//   DRAY_RETURN_IF_ERROR(WriteEmbeddedModel(scratch + "/model"));
//   ... LoadQwenImageModel(scratch + "/model", ...)
//
// Packed weights are one safetensors file whose tensors are named
// "<component>/<name>" (transformer/, vae/, text_encoder/); the trained
// transformer and VAE are stored as float16, the random text encoder as
// float32, and every component is unpacked as float32.
#ifndef DRAY_WORKERS_MODELS_QWEN_IMAGE_EMBEDDED_MODEL_H_
#define DRAY_WORKERS_MODELS_QWEN_IMAGE_EMBEDDED_MODEL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dray::qwen_image {

// WriteEmbeddedModel writes the embedded model into `dir` (the embedded
// preset's configs and tokenizer, and the linked-in weights).
absl::Status WriteEmbeddedModel(const std::string& dir);

// WriteModelWithPackedWeights writes the embedded preset's directory with
// the weights of the packed file at `packed_path` instead.
absl::Status WriteModelWithPackedWeights(const std::string& dir, const std::string& packed_path);

// PackModelWeights packs the weights of the embedded-preset model directory
// `model_dir` into `packed_path`.
absl::Status PackModelWeights(const std::string& model_dir, const std::string& packed_path);

}  // namespace dray::qwen_image

#endif  // DRAY_WORKERS_MODELS_QWEN_IMAGE_EMBEDDED_MODEL_H_
