#include "workers/models/flux/kontext_pipeline.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/models/image_resize.h"
#include "workers/models/layers.h"
#include "workers/models/pixels.h"
#include "workers/models/qwen_image/pipeline_helpers.h"

namespace dray::flux {
namespace {

using qwen_image::FlowMatchEulerScheduler;

// kClipLength: CLIP's prompt length (its position table).
constexpr int64_t kClipLength = 77;

// Pack: [B, C, H, W] latents to tokens [B, (H/2)(W/2), 4C].
absl::StatusOr<at::Tensor> Pack(const at::Tensor& latents) {
  return qwen_image::PackLatents(latents.unsqueeze(2));
}

// IdsAsInts: a batch of token id lists as int64 [B, L].
at::Tensor IdsAsInts(const std::vector<std::vector<int64_t>>& rows) {
  std::vector<at::Tensor> tensors;
  for (const std::vector<int64_t>& row : rows) tensors.push_back(at::tensor(row, at::kLong));
  return at::stack(tensors);
}

}  // namespace

FluxKontextPipeline::FluxKontextPipeline(FluxKontextModel model) : model_(std::move(model)) {}

absl::StatusOr<TextConditioning> FluxKontextPipeline::EncodePrompts(
    const std::vector<std::string>& prompts, int64_t max_sequence_length) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> clip_ids, t5_ids;
  for (const std::string& prompt : prompts) {
    DRAY_ASSIGN_OR_RETURN(clip_ids.emplace_back(),
                          model_.clip_tokenizer->Encode(prompt, kClipLength));
    DRAY_ASSIGN_OR_RETURN(t5_ids.emplace_back(),
                          model_.t5_tokenizer->Encode(prompt, max_sequence_length));
  }
  // Each encoder moves the ids to its own weights' device.
  DRAY_ASSIGN_OR_RETURN(clip::ClipTextOutput clip, model_.clip->forward(IdsAsInts(clip_ids)));
  DRAY_ASSIGN_OR_RETURN(at::Tensor t5, model_.t5->forward(IdsAsInts(t5_ids)));
  return TextConditioning{t5, clip.pooler_output};
}

absl::StatusOr<PreparedKontextEdit> FluxKontextPipeline::PrepareLatents(
    const std::vector<uint64_t>& seeds, const at::Tensor& pixels, int64_t height, int64_t width) {
  torch::NoGradGuard no_grad;
  const int64_t f = vae_scale_factor();
  const int64_t latent_h = 2 * (height / (2 * f)), latent_w = 2 * (width / (2 * f));
  const int64_t channels = model_.transformer->config().in_channels / 4;
  PreparedKontextEdit prepared;
  DRAY_ASSIGN_OR_RETURN(prepared.image_latents, EncodePixels(pixels));
  DRAY_ASSIGN_OR_RETURN(prepared.noise,
                        Pack(qwen_image::SeededNoise(seeds, {1, channels, latent_h, latent_w},
                                                     prepared.image_latents.options())));
  const int64_t image_rows = pixels.size(2) / f / 2, image_columns = pixels.size(3) / f / 2;
  prepared.img_ids = at::cat(
      {LatentImageIds(latent_h / 2, latent_w / 2, 0), LatentImageIds(image_rows, image_columns, 1)},
      0);
  prepared.height = height;
  prepared.width = width;
  return prepared;
}

absl::StatusOr<at::Tensor> FluxKontextPipeline::EncodePixels(const at::Tensor& pixels) {
  torch::NoGradGuard no_grad;
  const at::TensorOptions vae_options = model_.vae->parameters()[0].options();
  DRAY_ASSIGN_OR_RETURN(GaussianLatents encoded, model_.vae->Encode(pixels.to(vae_options)));
  return Pack(model_.vae->Normalize(AtLeastFloat32(encoded.mean)));
}

absl::StatusOr<at::Tensor> FluxKontextPipeline::EncodeImages(
    const std::vector<at::Tensor>& images) {
  return EncodePixels(ImagesToPixels(images, at::kFloat));
}

absl::StatusOr<PreparedKontextEdit> FluxKontextPipeline::Prepare(
    const std::vector<const KontextEditInput*>& rows, const KontextOptions& options) {
  if (rows.empty()) return absl::InvalidArgumentError("edit: no rows to prepare");
  std::vector<at::Tensor> images;
  std::vector<std::string> instructions;
  std::vector<uint64_t> seeds;
  const at::Tensor& first = rows[0]->image;
  DRAY_ASSIGN_OR_RETURN(KontextSizes sizes, ComputeKontextSizes(first.size(1), first.size(0),
                                                                options, vae_scale_factor()));
  for (const KontextEditInput* row : rows) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor resized, ResizeImage(row->image, sizes.image_height,
                                                          sizes.image_width, Resample::kLanczos));
    images.push_back(resized);
    instructions.push_back(row->instruction);
    seeds.push_back(row->seed);
  }
  DRAY_ASSIGN_OR_RETURN(
      PreparedKontextEdit prepared,
      PrepareLatents(seeds, ImagesToPixels(images, at::kFloat), sizes.height, sizes.width));
  DRAY_ASSIGN_OR_RETURN(prepared.prompt, EncodePrompts(instructions, options.max_sequence_length));
  if (options.true_cfg_scale > 1 && options.negative_prompt.has_value()) {
    const std::vector<std::string> negatives(rows.size(), *options.negative_prompt);
    DRAY_ASSIGN_OR_RETURN(prepared.negative, EncodePrompts(negatives, options.max_sequence_length));
  }
  prepared.txt_ids = at::zeros({prepared.prompt.embeds.size(1), 3}, at::kFloat);
  return prepared;
}

absl::StatusOr<at::Tensor> FluxKontextPipeline::Prediction(const PreparedKontextEdit& prepared,
                                                           const TextConditioning& text,
                                                           const at::Tensor& latents,
                                                           const at::Tensor& timestep,
                                                           double guidance_scale) {
  const at::Device device = model_.transformer->parameters()[0].device();
  FluxTransformerInputs inputs;
  inputs.hidden_states = at::cat({latents, prepared.image_latents.to(latents.scalar_type())}, 1);
  inputs.encoder_hidden_states = text.embeds;
  inputs.pooled_projections = text.pooled;
  inputs.timestep = (timestep / 1000).to(device);
  if (model_.transformer->config().guidance_embeds)
    inputs.guidance =
        at::full({latents.size(0)}, guidance_scale, timestep.options().device(device));
  inputs.img_ids = prepared.img_ids;
  inputs.txt_ids = prepared.txt_ids;
  DRAY_ASSIGN_OR_RETURN(at::Tensor out, model_.transformer->forward(inputs));
  return AtLeastFloat32(out.slice(1, 0, latents.size(1)));
}

absl::StatusOr<at::Tensor> FluxKontextPipeline::Velocity(const PreparedKontextEdit& prepared,
                                                         const at::Tensor& latents,
                                                         const at::Tensor& timestep,
                                                         double guidance_scale,
                                                         double true_cfg_scale) {
  DRAY_ASSIGN_OR_RETURN(at::Tensor cond,
                        Prediction(prepared, prepared.prompt, latents, timestep, guidance_scale));
  if (!prepared.negative.has_value()) return cond;
  DRAY_ASSIGN_OR_RETURN(at::Tensor negative, Prediction(prepared, *prepared.negative, latents,
                                                        timestep, guidance_scale));
  return negative + true_cfg_scale * (cond - negative);
}

absl::StatusOr<FlowMatchEulerScheduler> FluxKontextPipeline::Scheduler(int64_t image_seq_len,
                                                                       int steps) const {
  return qwen_image::ShiftedSchedule(model_.scheduler, image_seq_len, steps);
}

absl::StatusOr<at::Tensor> FluxKontextPipeline::DecodeLatents(const at::Tensor& latents,
                                                              int64_t height, int64_t width) {
  torch::NoGradGuard no_grad;
  DRAY_ASSIGN_OR_RETURN(at::Tensor unpacked,
                        qwen_image::UnpackLatents(latents, height, width, vae_scale_factor()));
  const at::Tensor vae_input =
      model_.vae->Denormalize(unpacked.select(2, 0)).to(model_.vae->parameters()[0].options());
  return model_.vae->Decode(vae_input);
}

absl::StatusOr<std::vector<at::Tensor>> FluxKontextPipeline::DecodeImages(const at::Tensor& latents,
                                                                          int64_t height,
                                                                          int64_t width) {
  DRAY_ASSIGN_OR_RETURN(at::Tensor decoded, DecodeLatents(latents, height, width));
  return PixelsToImages(decoded);
}

absl::StatusOr<std::vector<at::Tensor>> FluxKontextPipeline::Edit(
    const std::vector<KontextEditInput>& inputs, const KontextOptions& options,
    const KontextStepCallback& on_step) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> outputs;
  const int steps = options.num_inference_steps * static_cast<int>(inputs.size());
  int done = 0;
  for (const KontextEditInput& input : inputs) {
    if (!input.image.defined() || input.image.dim() != 3 || input.image.size(2) != 3 ||
        input.image.scalar_type() != at::kByte) {
      return absl::InvalidArgumentError(
          absl::StrCat("edit: row ", outputs.size(), "'s image must be RGB uint8 [H, W, 3]"));
    }
    DRAY_ASSIGN_OR_RETURN(PreparedKontextEdit prepared, Prepare({&input}, options));
    DRAY_ASSIGN_OR_RETURN(FlowMatchEulerScheduler scheduler,
                          Scheduler(prepared.noise.size(1), options.num_inference_steps));
    at::Tensor latents = prepared.noise;
    for (int i = 0; i < options.num_inference_steps; ++i) {
      DRAY_ASSIGN_OR_RETURN(
          at::Tensor velocity,
          Velocity(prepared, latents, scheduler.timesteps()[i].expand({latents.size(0)}),
                   options.guidance_scale, options.true_cfg_scale));
      DRAY_ASSIGN_OR_RETURN(latents, scheduler.Step(velocity, latents));
      if (on_step) DRAY_RETURN_IF_ERROR(on_step(++done, steps));
    }
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> images,
                          DecodeImages(latents, prepared.height, prepared.width));
    outputs.push_back(images[0]);
  }
  return outputs;
}

}  // namespace dray::flux
