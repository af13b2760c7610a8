#include "workers/models/qwen_image/edit_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/grad_mode.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/models/image_resize.h"
#include "workers/models/layers.h"
#include "workers/models/pixels.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/models/qwen_image/prompt_template.h"

namespace dray::qwen_image {
namespace {

absl::Status CheckOptions(const EditOptions& options) {
  if (options.num_inference_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_inference_steps must be at least 1, got ", options.num_inference_steps));
  }
  if (!(options.true_cfg_scale >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("true_cfg_scale must be >= 0, got ", options.true_cfg_scale));
  }
  if (options.image_size < 16 || options.condition_image_size < 16) {
    return absl::InvalidArgumentError(absl::StrCat("image_size and condition_image_size must be ",
                                                   ">= 16, got ", options.image_size, " and ",
                                                   options.condition_image_size));
  }
  for (const auto& side : {options.width, options.height}) {
    if (side.has_value() && *side < 1)
      return absl::InvalidArgumentError("output width and height must be positive");
  }
  return absl::OkStatus();
}

// CheckInput checks one row for a pipeline of `kind`.
absl::Status CheckInput(const EditInput& input, size_t row, EditPipelineKind kind) {
  if (absl::Status count = CheckPictureCount(input.images.size(), input.instruction, kind);
      !count.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("row ", row, ": ", count.message()));
  }
  for (size_t i = 0; i < input.images.size(); ++i) {
    const at::Tensor& image = input.images[i];
    if (!image.defined() || image.dim() != 3 || image.size(2) != 3 ||
        image.scalar_type() != at::kByte || image.size(0) < 1 || image.size(1) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("row ", row, ", image ", i + 1, ": the image must be RGB uint8 [H, W, 3]"));
    }
  }
  return absl::OkStatus();
}

// SizesOf: each image's {height, width}.
std::vector<std::pair<int64_t, int64_t>> SizesOf(const EditInput& input) {
  std::vector<std::pair<int64_t, int64_t>> sizes;
  for (const at::Tensor& image : input.images) sizes.push_back({image.size(0), image.size(1)});
  return sizes;
}

// SameImages: whether two rows' images are equal, pixel for pixel.
bool SameImages(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

// PadPrompts stacks prompts of different lengths ([tokens, hidden] each)
// into a batch, zero past each one's end, with its mask.
PromptEmbeddings PadPrompts(const std::vector<at::Tensor>& prompts) {
  int64_t longest = 0;
  for (const at::Tensor& prompt : prompts) longest = std::max(longest, prompt.size(0));
  const int64_t batch = static_cast<int64_t>(prompts.size());
  PromptEmbeddings out{at::zeros({batch, longest, prompts[0].size(1)}, prompts[0].options()),
                       at::zeros({batch, longest}, at::kLong)};
  for (int64_t b = 0; b < batch; ++b) {
    out.embeds[b].narrow(0, 0, prompts[b].size(0)).copy_(prompts[b]);
    out.mask[b].narrow(0, 0, prompts[b].size(0)).fill_(1);
  }
  out.mask = out.mask.to(prompts[0].device());
  return out;
}

}  // namespace

at::Tensor ToPixels(const std::vector<at::Tensor>& images, const at::TensorOptions& options) {
  return ImagesToPixels(images, options).unsqueeze(2);
}

QwenImageEditPipeline::QwenImageEditPipeline(QwenImageModel model) : model_(std::move(model)) {}

int64_t QwenImageEditPipeline::vae_scale_factor() const {
  return int64_t{1} << model_.vae->config().temperal_downsample.size();
}

absl::StatusOr<PromptEmbeddings> QwenImageEditPipeline::EncodePrompts(
    const std::vector<std::string>& instructions,
    const std::vector<std::vector<at::Tensor>>& images) {
  if (model_.tokenizer == nullptr || !model_.text_encoder) {
    return absl::FailedPreconditionError("the model has no tokenizer or text encoder loaded");
  }
  if (instructions.size() != images.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(instructions.size(), " instructions for ", images.size(), " rows of images"));
  }
  const qwen2_vl::TextEncoderConfig& config = model_.text_encoder->config();
  const int64_t pad_id = model_.tokenizer->TokenId("<|endoftext|>").value_or(0);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<at::Tensor> patches;
  std::vector<qwen2_vl::ImageGrid> grids;
  int64_t longest = 0;
  for (size_t i = 0; i < instructions.size(); ++i) {
    std::vector<int64_t> image_tokens;  // each image's <|image_pad|> count, in order
    for (const at::Tensor& image : images[i]) {
      DRAY_ASSIGN_OR_RETURN(qwen2_vl::ProcessedImage processed,
                            qwen2_vl::ProcessImage(image, model_.image_processor));
      image_tokens.push_back(processed.tokens(model_.image_processor));
      patches.push_back(processed.patches);
      grids.push_back(processed.grid);
    }
    absl::StatusOr<std::vector<int64_t>> ids =
        ExpandImagePads(EncodeEditPrompt(*model_.tokenizer, instructions[i], model_.pipeline,
                                         static_cast<int>(images[i].size())),
                        config.image_token_id, image_tokens);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("instruction ", i, ": ", ids.status().message()));
    }
    if (static_cast<int64_t>(ids->size()) <= kDroppedTemplateTokens) {
      return absl::InvalidArgumentError(absl::StrCat(
          "instruction ", i, ": its prompt has ", ids->size(), " tokens, no more than the ",
          kDroppedTemplateTokens, " template tokens the pipeline drops"));
    }
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ids->size()));
    prompts.push_back(*std::move(ids));
  }
  const int64_t batch = static_cast<int64_t>(prompts.size());
  at::Tensor ids = at::full({batch, longest}, pad_id, at::kLong);
  at::Tensor mask = at::zeros({batch, longest}, at::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = static_cast<int64_t>(prompts[b].size());
    ids[b].narrow(0, 0, length).copy_(at::tensor(prompts[b], at::kLong));
    mask[b].narrow(0, 0, length).fill_(1);
  }
  torch::NoGradGuard no_grad;
  const at::Tensor all_patches = patches.empty() ? at::Tensor() : at::cat(patches);
  DRAY_ASSIGN_OR_RETURN(at::Tensor hidden,
                        model_.text_encoder->forward(ids, mask, all_patches, grids));
  // Each prompt's states after the template's first 64 tokens (its system
  // turn, with Qwen2's vocabulary), right-padded with zeros.
  std::vector<at::Tensor> kept;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t length = static_cast<int64_t>(prompts[b].size()) - kDroppedTemplateTokens;
    kept.push_back(hidden[b].narrow(0, kDroppedTemplateTokens, length));
  }
  return PadPrompts(kept);
}

absl::Status CheckPictureCount(size_t images, absl::string_view instruction,
                               EditPipelineKind kind) {
  const bool plus = kind == EditPipelineKind::kEditPlus;
  const size_t most = plus ? kMaxEditPlusImages : 1;
  if (images == 0 || images > most) {
    return absl::InvalidArgumentError(absl::StrCat(
        images, " input images; ",
        plus ? "Qwen-Image-Edit-2509/2511 (Edit-Plus) takes 1 to " : "this model takes ", most,
        plus ? "" : " (an Edit-Plus model takes up to 3)"));
  }
  if (!plus) return absl::OkStatus();
  static const std::regex kPicture("picture\\s*(\\d+)", std::regex::icase);
  const std::string text(instruction);
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kPicture);
       it != std::sregex_iterator(); ++it) {
    const std::string number = (*it)[1].str();
    if (number.size() > 2 || std::stoi(number) < 1 ||
        std::stoi(number) > static_cast<int>(images)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the instruction names \"", it->str(), "\" but the row has ", images, " input images"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ExpandImagePads(const std::vector<int64_t>& ids,
                                                     int64_t image_pad_id,
                                                     const std::vector<int64_t>& image_tokens) {
  std::vector<int64_t> expanded;
  size_t pads = 0;
  for (int64_t id : ids) {
    if (id != image_pad_id) {
      expanded.push_back(id);
      continue;
    }
    if (pads < image_tokens.size()) expanded.insert(expanded.end(), image_tokens[pads], id);
    ++pads;
  }
  if (pads != image_tokens.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt places ", pads, " images, ", image_tokens.size(),
                     " were given (an instruction must not contain image placeholder tokens)"));
  }
  return expanded;
}

std::vector<int64_t> EncodeEditPrompt(const BpeTokenizer& tokenizer, absl::string_view instruction,
                                      EditPipelineKind kind, int images) {
  std::vector<int64_t> ids =
      tokenizer.Encode(EditPromptPrefix(images, kind == EditPipelineKind::kEditPlus));
  const std::vector<int64_t> text = tokenizer.EncodeText(instruction);
  const std::vector<int64_t> suffix = tokenizer.Encode(kEditPromptSuffix);
  ids.insert(ids.end(), text.begin(), text.end());
  ids.insert(ids.end(), suffix.begin(), suffix.end());
  return ids;
}

int64_t DenoisingLoops(const std::vector<EditInput>& inputs) {
  std::set<std::vector<std::pair<int64_t, int64_t>>> sizes;
  for (const EditInput& input : inputs) sizes.insert(SizesOf(input));
  return static_cast<int64_t>(sizes.size());
}

absl::StatusOr<std::vector<std::vector<size_t>>> SameSizeGroups(
    const std::vector<EditInput>& inputs, const EditOptions& options, EditPipelineKind kind) {
  DRAY_RETURN_IF_ERROR(CheckOptions(options));
  std::map<std::vector<std::pair<int64_t, int64_t>>, std::vector<size_t>> by_sizes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DRAY_RETURN_IF_ERROR(CheckInput(inputs[i], i, kind));
    by_sizes[SizesOf(inputs[i])].push_back(i);
  }
  std::vector<std::vector<size_t>> groups;
  for (auto& [sizes, indices] : by_sizes) groups.push_back(std::move(indices));
  return groups;
}

absl::StatusOr<std::vector<at::Tensor>> QwenImageEditPipeline::Edit(
    const std::vector<EditInput>& inputs, const EditOptions& options, const StepCallback& on_step) {
  DRAY_ASSIGN_OR_RETURN(std::vector<std::vector<size_t>> groups,
                        SameSizeGroups(inputs, options, model_.pipeline));
  std::vector<at::Tensor> results(inputs.size());
  last_edit_passes_.assign(inputs.size(), {});
  const int steps = options.num_inference_steps;
  const int total = steps * static_cast<int>(groups.size());
  int done_before = 0;
  for (const std::vector<size_t>& indices : groups) {
    std::vector<const EditInput*> rows;
    for (size_t i : indices) rows.push_back(&inputs[i]);
    StepCallback loop_step;
    if (on_step) {
      loop_step = [&, done_before](int step, int) { return on_step(done_before + step, total); };
    }
    torch::NoGradGuard no_grad;
    DRAY_ASSIGN_OR_RETURN(PreparedEdit prepared, Prepare(rows, options));
    EditPasses passes;
    DRAY_ASSIGN_OR_RETURN(at::Tensor latents, Denoise(prepared, options, loop_step, passes));
    for (size_t i : indices) last_edit_passes_[i] = passes;
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> images,
                          Decode(latents, prepared.height, prepared.width));
    done_before += steps;
    for (size_t k = 0; k < indices.size(); ++k) results[indices[k]] = std::move(images[k]);
  }
  return results;
}

absl::StatusOr<EditSizes> ComputeEditSizes(const std::vector<at::Tensor>& images,
                                           const EditOptions& options, EditPipelineKind kind,
                                           int64_t vae_scale_factor) {
  const int64_t scale = vae_scale_factor;
  const double area = static_cast<double>(options.image_size * options.image_size);
  const double prompt_area =
      kind == EditPipelineKind::kEditPlus
          ? static_cast<double>(options.condition_image_size * options.condition_image_size)
          : area;
  EditSizes sizes;
  for (const at::Tensor& image : images) {
    const double ratio = static_cast<double>(image.size(1)) / static_cast<double>(image.size(0));
    sizes.prompt.push_back(CalculateDimensions(prompt_area, ratio));
    sizes.vae.push_back(CalculateDimensions(area, ratio));
    for (const auto& [w, h] : {sizes.prompt.back(), sizes.vae.back()}) {
      if (w < 2 * scale || h < 2 * scale) {
        return absl::InvalidArgumentError(absl::StrCat("image ", image.size(1), "x", image.size(0),
                                                       ": resized to ", w, "x", h,
                                                       ", smaller than one latent token"));
      }
    }
  }
  const at::Tensor& last = images.back();  // diffusers: the output's aspect ratio
  std::tie(sizes.width, sizes.height) =
      EditOutputSize(last.size(1), last.size(0), options.width, options.height, scale, area);
  if (sizes.width < 2 * scale || sizes.height < 2 * scale) {
    return absl::InvalidArgumentError(absl::StrCat("output ", sizes.width, "x", sizes.height,
                                                   " is smaller than one latent token"));
  }
  return sizes;
}

absl::StatusOr<PreparedEdit> QwenImageEditPipeline::Prepare(
    const std::vector<const EditInput*>& rows, const EditOptions& options, ConditionCache* cache) {
  torch::NoGradGuard no_grad;
  const int64_t scale = vae_scale_factor();
  DRAY_ASSIGN_OR_RETURN(EditSizes sizes,
                        ComputeEditSizes(rows[0]->images, options, model_.pipeline, scale));
  PreparedEdit prepared;
  prepared.width = sizes.width;
  prepared.height = sizes.height;
  const int64_t width = prepared.width, height = prepared.height;
  const bool guided = options.negative_prompt.has_value() && options.true_cfg_scale > 1;
  ConditionCache local;
  if (cache == nullptr) cache = &local;
  const std::string cache_options =
      absl::StrCat(options.image_size, "/", options.condition_image_size, "/",
                   guided ? *options.negative_prompt : "", "/", guided);
  if (cache->options_ != cache_options) {
    cache->Clear();
    cache->options_ = cache_options;
  }

  // Rows asking the same of the same images (a GRPO group, a repeated
  // request) are resized and encoded once, then expanded back to rows.
  std::vector<int64_t> entry_of_row;
  std::vector<size_t> missing;  // entries encoded below
  const size_t encoded = cache->entries_.size();
  for (const EditInput* row : rows) {
    auto& entries = cache->entries_;
    auto same = std::find_if(entries.begin(), entries.end(), [row](const auto& entry) {
      return entry.instruction == row->instruction && SameImages(entry.images, row->images);
    });
    entry_of_row.push_back(same - entries.begin());
    if (same != entries.end()) continue;
    missing.push_back(entries.size());
    entries.push_back({row->instruction, row->images, {}, {}, {}});
  }
  const absl::Status encoding =
      EncodeConditions(*cache, missing, sizes, guided ? options.negative_prompt : std::nullopt);
  if (!encoding.ok()) {
    cache->entries_.resize(encoded);  // no half-made entries
    return encoding;
  }
  std::vector<at::Tensor> embeds, negative, latents;
  for (int64_t entry : entry_of_row) {
    const ConditionCache::Entry& e = cache->entries_[entry];
    embeds.push_back(e.embeds);
    negative.push_back(e.negative);
    latents.push_back(e.latents);
  }
  prepared.prompt = PadPrompts(embeds);
  if (guided) prepared.negative = PadPrompts(negative);
  prepared.image_latents = at::stack(latents);

  // Noise per row from its own seed.
  const int64_t channels = model_.transformer->config().in_channels / 4;
  const int64_t latent_h = 2 * (height / (scale * 2)), latent_w = 2 * (width / (scale * 2));
  std::vector<uint64_t> seeds;
  for (const EditInput* row : rows) seeds.push_back(row->seed);
  DRAY_ASSIGN_OR_RETURN(prepared.noise,
                        PackLatents(SeededNoise(seeds, {1, channels, 1, latent_h, latent_w},
                                                prepared.image_latents.options())));
  SampleImages shapes = {{1, latent_h / 2, latent_w / 2}};
  for (const auto& [w, h] : sizes.vae) shapes.push_back({1, h / scale / 2, w / scale / 2});
  prepared.shapes.assign(rows.size(), shapes);
  return prepared;
}

absl::Status QwenImageEditPipeline::EncodeConditions(
    ConditionCache& cache, const std::vector<size_t>& entries, const EditSizes& sizes,
    const std::optional<std::string>& negative_prompt) {
  if (entries.empty()) return absl::OkStatus();
  std::vector<std::vector<at::Tensor>> for_prompt(entries.size());
  std::vector<std::vector<at::Tensor>> for_vae(sizes.vae.size());  // by image, then entry
  std::vector<std::string> instructions;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ConditionCache::Entry& entry = cache.entries_[entries[i]];
    for (size_t j = 0; j < entry.images.size(); ++j) {
      const auto [prompt_w, prompt_h] = sizes.prompt[j];
      const auto [vae_w, vae_h] = sizes.vae[j];
      DRAY_ASSIGN_OR_RETURN(at::Tensor prompt_image,
                            ResizeImage(entry.images[j], prompt_h, prompt_w, Resample::kLanczos));
      at::Tensor vae_image = prompt_image;
      if (sizes.vae[j] != sizes.prompt[j]) {
        DRAY_ASSIGN_OR_RETURN(vae_image,
                              ResizeImage(entry.images[j], vae_h, vae_w, Resample::kLanczos));
      }
      for_prompt[i].push_back(prompt_image);
      for_vae[j].push_back(vae_image);
    }
    instructions.push_back(entry.instruction);
  }
  // Each row's states without the batch's padding.
  auto unpadded = [](const PromptEmbeddings& prompts, size_t i) {
    return prompts.embeds[i].narrow(0, 0, prompts.mask[i].sum().item<int64_t>());
  };
  DRAY_ASSIGN_OR_RETURN(PromptEmbeddings prompts, EncodePrompts(instructions, for_prompt));
  std::optional<PromptEmbeddings> negatives;
  if (negative_prompt.has_value()) {
    DRAY_ASSIGN_OR_RETURN(
        negatives,
        EncodePrompts(std::vector<std::string>(entries.size(), *negative_prompt), for_prompt));
  }
  std::vector<at::Tensor> latents;  // each image's tokens, one after another
  for (const std::vector<at::Tensor>& image : for_vae) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor encoded, EncodeImages(image));
    latents.push_back(encoded);
  }
  const at::Tensor all_latents = at::cat(latents, 1);
  for (size_t i = 0; i < entries.size(); ++i) {
    ConditionCache::Entry& entry = cache.entries_[entries[i]];
    entry.embeds = unpadded(prompts, i);
    if (negatives.has_value()) entry.negative = unpadded(*negatives, i);
    entry.latents = all_latents[i];
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> QwenImageEditPipeline::EncodeImages(
    const std::vector<at::Tensor>& images) {
  torch::NoGradGuard no_grad;
  const at::TensorOptions vae_options = model_.vae->parameters()[0].options();
  DRAY_ASSIGN_OR_RETURN(LatentDistribution encoded,
                        model_.vae->Encode(ToPixels(images, vae_options)));
  return PackLatents(model_.vae->Normalize(AtLeastFloat32(encoded.mean)));  // float32 latents
}

absl::StatusOr<std::vector<at::Tensor>> QwenImageEditPipeline::Decode(const at::Tensor& latents,
                                                                      int64_t height,
                                                                      int64_t width) {
  torch::NoGradGuard no_grad;
  DRAY_ASSIGN_OR_RETURN(at::Tensor unpacked,
                        UnpackLatents(latents, height, width, vae_scale_factor()));
  const at::Tensor vae_input =
      model_.vae->Denormalize(unpacked).to(model_.vae->parameters()[0].options());
  DRAY_ASSIGN_OR_RETURN(at::Tensor decoded, model_.vae->Decode(vae_input));
  return PixelsToImages(decoded.select(2, 0));
}

absl::StatusOr<FlowMatchEulerScheduler> QwenImageEditPipeline::Scheduler(int64_t image_seq_len,
                                                                         int steps) const {
  return ShiftedSchedule(model_.scheduler, image_seq_len, steps);
}

Denoiser DenoiserOf(QwenImageTransformerImpl& transformer) {
  return [&transformer](const at::Tensor& hidden, const PromptEmbeddings& text,
                        const at::Tensor& timestep, const std::vector<SampleImages>& shapes) {
    return transformer.forward(hidden, text.embeds, text.mask, timestep, shapes);
  };
}

absl::StatusOr<at::Tensor> QwenImageEditPipeline::Velocity(const PreparedEdit& prepared,
                                                           const at::Tensor& latents,
                                                           const at::Tensor& timestep,
                                                           double true_cfg_scale,
                                                           const Denoiser& denoiser) {
  const Denoiser& denoise = denoiser ? denoiser : DenoiserOf(*model_.transformer);
  const at::Tensor scaled = (timestep / 1000).to(latents.options());
  auto predict = [&](const PromptEmbeddings& text) -> absl::StatusOr<at::Tensor> {
    // Edits (Denoise) cache the model's own transformer's passes, if asked.
    const bool cached = step_caches_ != nullptr && !denoiser;
    if (cached)
      model_.transformer->set_step_cache(&(*step_caches_)[&text == &prepared.prompt ? 0 : 1]);
    const absl::Cleanup no_cache = [&] {
      if (cached) model_.transformer->set_step_cache(nullptr);
    };
    DRAY_ASSIGN_OR_RETURN(at::Tensor out, denoise(at::cat({latents, prepared.image_latents}, 1),
                                                  text, scaled, prepared.shapes));
    return out.narrow(1, 0, latents.size(1)).to(latents.scalar_type());
  };
  if (!prepared.negative.has_value()) return predict(prepared.prompt);
  if (cfg_group_ != nullptr && !denoiser) {
    const bool negative_side = cfg_group_->rank() == 1;
    DRAY_ASSIGN_OR_RETURN(at::Tensor own,
                          predict(negative_side ? *prepared.negative : prepared.prompt));
    own = own.contiguous();
    at::Tensor both = at::empty({2, own.numel()}, own.options());
    DRAY_RETURN_IF_ERROR(cfg_group_->AllGather(own, both));
    return TrueCfg(both[0].view_as(own), both[1].view_as(own), true_cfg_scale);
  }
  DRAY_ASSIGN_OR_RETURN(at::Tensor velocity, predict(prepared.prompt));
  DRAY_ASSIGN_OR_RETURN(at::Tensor negative, predict(*prepared.negative));
  return TrueCfg(velocity, negative, true_cfg_scale);
}

absl::StatusOr<at::Tensor> QwenImageEditPipeline::Denoise(const PreparedEdit& prepared,
                                                          const EditOptions& options,
                                                          const StepCallback& on_step,
                                                          EditPasses& passes) {
  const int steps = options.num_inference_steps;
  at::Tensor latents = prepared.noise;
  DRAY_ASSIGN_OR_RETURN(FlowMatchEulerScheduler scheduler, Scheduler(latents.size(1), steps));
  std::array<StepCache, 2> caches = {StepCache(options.step_cache), StepCache(options.step_cache)};
  step_caches_ = options.step_cache.threshold > 0 ? &caches : nullptr;
  const absl::Cleanup done = [&] {
    step_caches_ = nullptr;
    for (const StepCache& cache : caches) {
      passes.passes += cache.passes();
      passes.reused += cache.reused();
    }
  };
  for (int i = 0; i < steps; ++i) {
    const at::Tensor timestep = scheduler.timesteps()[i].expand({latents.size(0)});
    DRAY_ASSIGN_OR_RETURN(at::Tensor velocity,
                          Velocity(prepared, latents, timestep, options.true_cfg_scale));
    DRAY_ASSIGN_OR_RETURN(latents, scheduler.Step(velocity, latents));
    if (on_step) DRAY_RETURN_IF_ERROR(on_step(i + 1, steps));
  }
  return latents;
}

}  // namespace dray::qwen_image
