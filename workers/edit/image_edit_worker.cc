#include "workers/edit/image_edit_worker.h"

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/models/lora.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_config.h"
#include "workers/pipeline/edit_model.h"

namespace dray {

QwenImageEditWorker::QwenImageEditWorker() {
  Def("init_model", &QwenImageEditWorker::InitModel, {kOneToAll});
  // Rows are edited independently (each has its own seed): a batch is split
  // among the ranks without padding rows, and ranks without rows idle.
  MethodOptions per_row;
  per_row.dispatch_mode = kDpComputeProto;
  per_row.rows_independent = true;
  per_row.collective = true;  // EditImagesBatch stops with its group (AgreedStop)
  Def("edit_images_batch", &QwenImageEditWorker::EditImagesBatch, per_row);
  Def("process_batch", &QwenImageEditWorker::EditImagesBatch, per_row);
}

QwenImageEditWorker::~QwenImageEditWorker() = default;

absl::StatusOr<DataProto> QwenImageEditWorker::InitModel(const DataProto& input) {
  DRAY_ASSIGN_OR_RETURN(std::string yaml, input.GetMeta<std::string>("config"));
  DRAY_ASSIGN_OR_RETURN(ImageEditConfig config, ImageEditConfig::FromYaml(yaml));
  // Nothing trains here: every shard is stored in the compute dtype.
  auto freeze = [&config](const EditModules& model) -> absl::Status {
    if (!config.lora_path.empty())
      DRAY_RETURN_IF_ERROR(LoadLoraAdapters(*model.transformer, config.lora_path).status());
    std::vector<std::shared_ptr<torch::nn::Module>> modules = {model.transformer, model.vae};
    modules.insert(modules.end(), model.text_encoders.begin(), model.text_encoders.end());
    for (const auto& module : modules)
      for (auto& parameter : module->parameters()) parameter.set_requires_grad(false);
    return absl::OkStatus();
  };
  DRAY_ASSIGN_OR_RETURN(model_, LoadEditModel(config, *this, freeze));
  // The loaded model's own tokenizer and pipeline (FLUX.1 Kontext edits one
  // picture, as Qwen-Image-Edit does).
  const bool kontext = model_->family == ModelFamily::kFluxKontext;
  pipeline_kind_ = kontext ? qwen_image::EditPipelineKind::kEdit : model_->model().pipeline;
  count_tokens_ = kontext ? CountTokensWith(model_->kontext->model().t5_tokenizer)
                          : CountTokensWith(model_->model().tokenizer);
  return DataProto::Make({}, {}, model_->MemoryFigures(rank()));
}

absl::Status QwenImageEditWorker::AgreedStop() {
  // Sharded ranks gather parameters together, and the ranks of one edit
  // exchange its passes: they stop together.
  return model_->sharded()    ? StopRequestedOnAnyRank()
         : model_->edit_group ? StopRequestedOnAnyRank(model_->edit_group.get())
                              : StopRequested();
}

absl::Status QwenImageEditWorker::StopBetweenSteps(int64_t done, int64_t steps) {
  const absl::Status stop = AgreedStop();
  if (stop.ok()) return stop;
  return absl::Status(stop.code(),
                      absl::StrCat(stop.message(), "; stopped after step ", done, " of ", steps));
}

namespace {

// RowsFingerprint: a hash of the rows' instructions, seeds and pixels, the
// same in every process of one build (std::hash is not salted).
int64_t RowsFingerprint(const std::vector<EditRow>& rows) {
  size_t hash = rows.size();
  auto mix = [&hash](std::string_view bytes) {
    hash = (hash * 1099511628211u) ^ std::hash<std::string_view>{}(bytes);
  };
  for (const EditRow& row : rows) {
    mix(row.instruction);
    mix(std::string_view(reinterpret_cast<const char*>(&row.seed), sizeof(row.seed)));
    for (const at::Tensor& image : row.images) {
      const at::Tensor pixels = image.contiguous();
      mix(std::string_view(static_cast<const char*>(pixels.data_ptr()), pixels.nbytes()));
    }
  }
  return static_cast<int64_t>(hash);
}

}  // namespace

absl::Status QwenImageEditWorker::CheckSameRows(const std::vector<EditRow>& rows) {
  Communicator& group = *model_->edit_group;
  const at::Tensor mine =
      at::tensor({static_cast<int64_t>(rows.size()), RowsFingerprint(rows)}, at::kLong);
  at::Tensor all = at::empty({group.world_size(), 2}, at::kLong);
  DRAY_RETURN_IF_ERROR(group.AllGather(mine, all));
  if (at::equal(all, mine.expand_as(all))) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", group.world_size(), " ranks of one edit (", model_->config.EditLayout(),
      ") were given different rows: call edit_images_batch with CallOptions::rank_group_size = ",
      group.world_size(), ", as ImageEditController does"));
}

absl::StatusOr<DataProto> QwenImageEditWorker::EditImagesBatch(const DataProto& batch) {
  if (model_ == nullptr)
    return absl::FailedPreconditionError("call init_model before editing images");
  if (absl::Status stop = AgreedStop(); !stop.ok()) {  // the group's first collective
    return absl::Status(stop.code(), absl::StrCat("not started: ", stop.message()));
  }
  // Admission again: a caller other than the controller gets the same limits.
  DRAY_RETURN_IF_ERROR(CheckEditBatch(batch, model_->config, pipeline_kind_, count_tokens_));
  DRAY_ASSIGN_OR_RETURN(std::vector<EditRow> rows, DecodeEditRows(batch, model_->config.seed));
  if (model_->edit_group) DRAY_RETURN_IF_ERROR(CheckSameRows(rows));
  if (model_->config.enable_cpu_offload)
    DRAY_RETURN_IF_ERROR(model_->MoveParameters(model_->device));
  absl::StatusOr<DataProto> answer = model_->family == ModelFamily::kFluxKontext
                                         ? EditKontextRows(rows, batch.meta_info())
                                         : EditRows(rows, batch.meta_info());
  if (model_->config.enable_cpu_offload) DRAY_RETURN_IF_ERROR(model_->MoveParameters(at::kCPU));
  return answer;
}

absl::StatusOr<DataProto> QwenImageEditWorker::EditRows(const std::vector<EditRow>& rows,
                                                        const MetaInfo& meta) {
  DRAY_ASSIGN_OR_RETURN(qwen_image::EditOptions options, EditOptionsFor(model_->config, meta));
  std::vector<at::Tensor> edited;
  // Micro-batches of batch_size rows; the steps of all their denoising loops
  // make the call's progress.
  std::vector<std::vector<qwen_image::EditInput>> micro_batches;
  const size_t micro_batch = static_cast<size_t>(model_->config.batch_size);
  int64_t total_steps = 0;
  for (size_t start = 0; start < rows.size(); start += micro_batch) {
    std::vector<qwen_image::EditInput>& inputs = micro_batches.emplace_back();
    for (size_t i = start; i < std::min(rows.size(), start + micro_batch); ++i) {
      inputs.push_back({rows[i].images, rows[i].instruction, rows[i].seed});  // on the CPU
    }
    total_steps += qwen_image::DenoisingLoops(inputs) * options.num_inference_steps;
  }
  int64_t done_before = 0;
  std::vector<int64_t> passes, reused;  // each row's loop's, with a step cache
  for (const std::vector<qwen_image::EditInput>& inputs : micro_batches) {
    int64_t done = 0;
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> images,
                          model_->pipeline->Edit(inputs, options, [&](int step, int) {
                            done = step;
                            ReportProgress(kDenoisingProgress, done_before + step, total_steps);
                            return StopBetweenSteps(done_before + step, total_steps);
                          }));
    done_before += done;
    for (const qwen_image::EditPasses& row : model_->pipeline->last_edit_passes()) {
      passes.push_back(row.passes);
      reused.push_back(row.reused);
    }
    edited.insert(edited.end(), images.begin(), images.end());
  }
  at::Tensor counts = at::stack({at::tensor(passes, at::kLong), at::tensor(reused, at::kLong)});
  if (model_->edit_group != nullptr) {
    // Each CFG branch counted its own passes, each of its Ulysses ranks the
    // same ones; the first rank answers for the edit.
    if (counts.numel() > 0) DRAY_RETURN_IF_ERROR(model_->edit_group->AllReduce(counts));
    counts = counts.div(model_->config.ulysses_degree, "floor");
    if (model_->edit_group->rank() != 0) return DataProto();
  }
  return Answer(edited, counts);
}

absl::StatusOr<DataProto> QwenImageEditWorker::EditKontextRows(const std::vector<EditRow>& rows,
                                                               const MetaInfo& meta) {
  std::vector<flux::KontextOptions> options;
  int64_t total_steps = 0;
  for (const EditRow& row : rows) {
    DRAY_ASSIGN_OR_RETURN(
        options.emplace_back(),
        KontextOptionsFor(model_->config, meta, row.images[0].size(1), row.images[0].size(0)));
    total_steps += options.back().num_inference_steps;
  }
  std::vector<at::Tensor> edited;
  std::vector<int64_t> passes;
  int64_t done_before = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const flux::KontextEditInput input{rows[i].images[0], rows[i].instruction, rows[i].seed};
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> images,
                          model_->kontext->Edit({input}, options[i], [&](int step, int) {
                            ReportProgress(kDenoisingProgress, done_before + step, total_steps);
                            return StopBetweenSteps(done_before + step, total_steps);
                          }));
    done_before += options[i].num_inference_steps;
    const bool guided = options[i].true_cfg_scale > 1 && options[i].negative_prompt.has_value();
    passes.push_back(options[i].num_inference_steps * (guided ? 2 : 1));
    edited.push_back(images[0]);
  }
  const at::Tensor counts = at::tensor(passes, at::kLong);
  return Answer(edited, at::stack({counts, at::zeros_like(counts)}));
}

absl::StatusOr<DataProto> QwenImageEditWorker::Answer(const std::vector<at::Tensor>& images,
                                                      at::Tensor counts) {
  std::vector<Image> edited;
  for (const at::Tensor& image : images) {
    DRAY_ASSIGN_OR_RETURN(std::string png, EncodePng(image.cpu()));
    edited.push_back({Image::Format::kPng, static_cast<int32_t>(image.size(1)),
                      static_cast<int32_t>(image.size(0)), 3, Bytes(std::move(png))});
  }
  return DataProto::Make({{kTransformerPassesColumn, counts[0]}, {kReusedPassesColumn, counts[1]}},
                         {{kEditedColumn, std::move(edited)}});
}

}  // namespace dray
