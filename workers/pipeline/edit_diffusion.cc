#include "workers/pipeline/edit_diffusion.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {
namespace {

// Overloaded: a visitor of the lambdas given (one per alternative).
template <typename... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <typename... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

}  // namespace

const at::Tensor& PreparedRows::noise() const {
  return std::visit([](const auto& edit) -> const at::Tensor& { return edit.noise; }, edit_);
}

int64_t PreparedRows::height() const {
  return std::visit([](const auto& edit) { return edit.height; }, edit_);
}

int64_t PreparedRows::width() const {
  return std::visit([](const auto& edit) { return edit.width; }, edit_);
}

void PreparedRows::DropGuidance() {
  std::visit([](auto& edit) { edit.negative.reset(); }, edit_);
}

absl::StatusOr<PreparedRows> EditDiffusion::Prepare(const std::vector<qwen_image::EditInput>& rows,
                                                    const qwen_image::EditOptions& options,
                                                    qwen_image::ConditionCache* cache) {
  const qwen_image::EditPipelineKind kind =
      kontext() ? qwen_image::EditPipelineKind::kEdit : model_.model().pipeline;
  DRAY_ASSIGN_OR_RETURN(auto groups, qwen_image::SameSizeGroups(rows, options, kind));
  if (groups.size() != 1) {
    return absl::InvalidArgumentError(
        "a training batch's input images must share one size (sharded ranks run in step)");
  }
  if (kontext()) {
    const std::vector<flux::KontextEditInput> kontext_rows = KontextRows(rows);
    std::vector<const flux::KontextEditInput*> pointers;
    for (const flux::KontextEditInput& row : kontext_rows) pointers.push_back(&row);
    DRAY_ASSIGN_OR_RETURN(
        flux::PreparedKontextEdit prepared,
        model_.kontext->Prepare(pointers, KontextOptions(options, kontext_rows[0].image)));
    return PreparedRows(std::move(prepared));
  }
  std::vector<const qwen_image::EditInput*> pointers;
  for (const qwen_image::EditInput& row : rows) pointers.push_back(&row);
  DRAY_ASSIGN_OR_RETURN(qwen_image::PreparedEdit prepared,
                        model_.pipeline->Prepare(pointers, options, cache));
  return PreparedRows(std::move(prepared));
}

absl::StatusOr<at::Tensor> EditDiffusion::Velocity(const PreparedRows& prepared,
                                                   const at::Tensor& latents,
                                                   const at::Tensor& timestep,
                                                   double true_cfg_scale,
                                                   const qwen_image::Denoiser& denoiser) {
  return std::visit(
      Overloaded{
          [&](const qwen_image::PreparedEdit& edit) {
            return model_.pipeline->Velocity(edit, latents, timestep, true_cfg_scale, denoiser);
          },
          [&](const flux::PreparedKontextEdit& edit) -> absl::StatusOr<at::Tensor> {
            if (denoiser) {
              return absl::UnimplementedError(
                  "FLUX.1 Kontext runs its own transformer only (no frozen reference copy or "
                  "DMD2 score)");
            }
            return model_.kontext->Velocity(edit, latents, timestep, model_.config.guidance_scale,
                                            true_cfg_scale);
          }},
      prepared.edit_);
}

absl::StatusOr<qwen_image::FlowMatchEulerScheduler> EditDiffusion::Scheduler(int64_t image_seq_len,
                                                                             int steps) const {
  if (kontext()) return model_.kontext->Scheduler(image_seq_len, steps);
  return model_.pipeline->Scheduler(image_seq_len, steps);
}

absl::StatusOr<at::Tensor> EditDiffusion::EncodeImages(const std::vector<at::Tensor>& images) {
  if (kontext()) return model_.kontext->EncodeImages(images);
  return model_.pipeline->EncodeImages(images);
}

absl::StatusOr<std::vector<at::Tensor>> EditDiffusion::Decode(const at::Tensor& latents,
                                                              int64_t height, int64_t width) {
  if (kontext()) return model_.kontext->DecodeImages(latents, height, width);
  return model_.pipeline->Decode(latents, height, width);
}

absl::StatusOr<std::vector<at::Tensor>> EditDiffusion::Edit(
    const std::vector<qwen_image::EditInput>& rows, const qwen_image::EditOptions& options) {
  if (!kontext()) return model_.pipeline->Edit(rows, options);
  // Checks each row (one RGB image); each is then edited on its own.
  DRAY_RETURN_IF_ERROR(
      qwen_image::SameSizeGroups(rows, options, qwen_image::EditPipelineKind::kEdit).status());
  std::vector<at::Tensor> edited;
  for (const flux::KontextEditInput& row : KontextRows(rows)) {  // each at its aspect ratio
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> one,
                          model_.kontext->Edit({row}, KontextOptions(options, row.image)));
    edited.push_back(one[0]);
  }
  return edited;
}

std::vector<flux::KontextEditInput> EditDiffusion::KontextRows(
    const std::vector<qwen_image::EditInput>& rows) {
  std::vector<flux::KontextEditInput> out;
  for (const qwen_image::EditInput& row : rows)
    out.push_back({row.images.empty() ? at::Tensor() : row.images[0], row.instruction, row.seed});
  return out;
}

flux::KontextOptions EditDiffusion::KontextOptions(const qwen_image::EditOptions& options,
                                                   const at::Tensor& image) const {
  const ImageEditConfig& config = model_.config;
  return KontextOptionsOf(options, config.guidance_scale, config.max_prompt_tokens, image.size(1),
                          image.size(0));
}

}  // namespace dray
