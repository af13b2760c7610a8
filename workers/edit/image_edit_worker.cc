#include "workers/edit/image_edit_worker.h"

#include <ATen/Context.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "runtime/sharding/fully_sharded.h"
#include "runtime/sharding/replicate.h"
#include "workers/edit/edit_batch.h"
#include "workers/edit/edit_config.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"

namespace dray {
namespace {

absl::StatusOr<at::Device> ParseDevice(const std::string& name) {
  if (name == "cpu") return at::Device(at::kCPU);
  if (!at::globalContext().hasCUDA()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device '", name, "' needs CUDA; this build or machine has none (use device=cpu)"));
  }
  // The controller sets CUDA_VISIBLE_DEVICES to the local rank: "cuda" is this worker's GPU.
  return name == "cuda" ? at::Device(at::kCUDA, 0) : at::Device(name);
}

at::ScalarType ParseDtype(const std::string& name) {
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  return at::kFloat;  // validated by ImageEditConfig
}

// ResidentBytes: this process's resident memory, from /proc/self/statm.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * 4096;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// WholeModels: transformer, text encoder and VAE, as plain modules.
std::vector<std::shared_ptr<torch::nn::Module>> WholeModels(
    const qwen_image::QwenImageModel& model) {
  return {model.transformer.ptr(), model.text_encoder.ptr(), model.vae.ptr()};
}

int64_t ModelsBytes(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  int64_t bytes = 0;
  for (const auto& module : modules) bytes += ModuleBytes(*module);
  return bytes;
}

}  // namespace

struct QwenImageEditWorker::State {
  ImageEditConfig config;
  at::Device device{at::kCPU};
  // Declared before the pipeline, whose models call them: destroyed after it.
  std::unique_ptr<FullyShardedModule> transformer_shards, text_encoder_shards;
  std::unique_ptr<qwen_image::QwenImageEditPipeline> pipeline;

  qwen_image::QwenImageModel& model() { return pipeline->model(); }

  // BlockModelBytes: the parameter memory this rank holds of the models
  // FSDP shards (transformer and text encoder); the VAE is always whole.
  int64_t BlockModelBytes() {
    if (transformer_shards == nullptr)
      return ModelsBytes({model().transformer.ptr(), model().text_encoder.ptr()});
    return transformer_shards->LocalBytes().parameters +
           text_encoder_shards->LocalBytes().parameters;
  }
  int64_t ParameterBytes() { return BlockModelBytes() + ModuleBytes(*model().vae); }

  // MoveParameters puts every parameter (the shards, under FSDP) on `device`.
  absl::Status MoveParameters(at::Device device) {
    torch::NoGradGuard no_grad;
    if (transformer_shards != nullptr) {
      DRAY_RETURN_IF_ERROR(device.is_cpu() ? transformer_shards->Offload()
                                           : transformer_shards->Load(device));
      DRAY_RETURN_IF_ERROR(device.is_cpu() ? text_encoder_shards->Offload()
                                           : text_encoder_shards->Load(device));
    } else {
      model().transformer->to(device);
      model().text_encoder->to(device);
    }
    model().vae->to(device);
    return absl::OkStatus();
  }
};

QwenImageEditWorker::QwenImageEditWorker() {
  Def("init_model", &QwenImageEditWorker::InitModel, {kOneToAll});
  // Rows are edited independently (each has its own seed): a batch is split
  // among the ranks without padding rows, and ranks without rows idle.
  MethodOptions per_row;
  per_row.dispatch_mode = kDpComputeProto;
  per_row.rows_independent = true;
  Def("edit_images_batch", &QwenImageEditWorker::EditImagesBatch, per_row);
  Def("process_batch", &QwenImageEditWorker::EditImagesBatch, per_row);
}

QwenImageEditWorker::~QwenImageEditWorker() = default;

absl::StatusOr<DataProto> QwenImageEditWorker::InitModel(const DataProto& input) {
  DRAY_ASSIGN_OR_RETURN(std::string yaml, input.GetMeta<std::string>("config"));
  DRAY_ASSIGN_OR_RETURN(ImageEditConfig config, ImageEditConfig::FromYaml(yaml));
  if (config.model_path.empty()) {
    return absl::InvalidArgumentError(
        "init_model needs worker.image_edit.model_path (the controller writes the "
        "embedded model and passes its path)");
  }
  auto state = std::make_unique<State>();
  DRAY_ASSIGN_OR_RETURN(state->device, ParseDevice(config.device));
  const at::ScalarType dtype = ParseDtype(config.torch_dtype);
  auto log = [&](const char* phase, int64_t parameter_bytes) {
    std::fprintf(stderr, "init_model: %-26s resident %8.1f MiB, parameters %8.1f MiB\n", phase,
                 MiB(ResidentBytes()), MiB(parameter_bytes));
    std::fflush(stderr);
  };
  log("start", 0);

  // With sync_module_states only rank 0 reads the weights; the others build
  // shape-only and receive them. Under FSDP the shards are float32 masters
  // and torch_dtype is the compute dtype (mixed precision).
  const bool receives = config.fsdp_sync_module_states && world_size() > 1 && rank() != 0;
  const bool sends = config.fsdp_sync_module_states && world_size() > 1;
  const at::TensorOptions options =
      at::TensorOptions().device(state->device).dtype(config.enable_fsdp ? at::kFloat : dtype);
  DRAY_ASSIGN_OR_RETURN(
      qwen_image::QwenImageModel model,
      qwen_image::LoadQwenImageModel(config.model_path, options,
                                     receives ? Weights::kShapeOnly : Weights::kRead));
  log(receives ? "built shape-only" : "weights read", ModelsBytes(WholeModels(model)));

  Communicator* group = nullptr;
  if (sends || config.enable_fsdp) {
    DRAY_ASSIGN_OR_RETURN(group, state->device.is_cuda() ? device_comm() : comm());
  }
  if (config.enable_fsdp) {
    ShardingOptions sharding;
    DRAY_ASSIGN_OR_RETURN(sharding.strategy, ParseShardingStrategy(config.fsdp_sharding_strategy));
    sharding.sync_module_states = sends;
    sharding.cpu_offload = config.fsdp_cpu_offload;
    if (dtype != at::kFloat) sharding.mixed_precision.param_dtype = dtype;
    std::vector<std::shared_ptr<torch::nn::Module>> blocks(model.transformer->blocks()->begin(),
                                                           model.transformer->blocks()->end());
    DRAY_ASSIGN_OR_RETURN(
        state->transformer_shards,
        FullyShardedModule::Shard(model.transformer.ptr(), blocks, group, sharding));
    DRAY_ASSIGN_OR_RETURN(state->text_encoder_shards,
                          FullyShardedModule::Shard(model.text_encoder.ptr(),
                                                    model.text_encoder->blocks(), group, sharding));
    model.transformer->set_unit_hooks(state->transformer_shards.get());
    model.text_encoder->set_unit_hooks(state->text_encoder_shards.get());
    if (sends) DRAY_RETURN_IF_ERROR(BroadcastModule(*model.vae, group));
    if (dtype != at::kFloat) model.vae->to(dtype);
  } else if (sends) {
    for (const auto& module : WholeModels(model))
      DRAY_RETURN_IF_ERROR(BroadcastModule(*module, group));
  }
  state->config = std::move(config);
  state->pipeline = std::make_unique<qwen_image::QwenImageEditPipeline>(std::move(model));
  log(state->transformer_shards ? "sharded"
      : sends                   ? "received"
                                : "ready",
      state->ParameterBytes());
  if (state->config.enable_cpu_offload) {
    DRAY_RETURN_IF_ERROR(state->MoveParameters(at::kCPU));
    log("offloaded to CPU", state->ParameterBytes());
  }
  if (group != nullptr) DRAY_RETURN_IF_ERROR(group->Barrier());
  MetaInfo figures = {{"rank", int64_t{rank()}},
                      {"parameter_bytes", state->ParameterBytes()},
                      {"block_model_parameter_bytes", state->BlockModelBytes()},
                      {"resident_bytes", ResidentBytes()}};
  state_ = std::move(state);
  return DataProto::Make({}, {}, std::move(figures));
}

absl::Status QwenImageEditWorker::StopBetweenSteps(int64_t done, int64_t steps) {
  // Sharded ranks gather parameters together: they stop together.
  const absl::Status stop =
      state_->transformer_shards != nullptr ? StopRequestedOnAnyRank() : StopRequested();
  if (stop.ok()) return stop;
  return absl::Status(stop.code(),
                      absl::StrCat(stop.message(), "; stopped after step ", done, " of ", steps));
}

absl::StatusOr<DataProto> QwenImageEditWorker::EditImagesBatch(const DataProto& batch) {
  if (state_ == nullptr)
    return absl::FailedPreconditionError("call init_model before editing images");
  // Admission again: a caller other than the controller gets the same limits.
  DRAY_RETURN_IF_ERROR(
      CheckEditBatch(batch, state_->config, CountTokensWith(state_->model().tokenizer)));
  DRAY_ASSIGN_OR_RETURN(std::vector<EditRow> rows, DecodeEditRows(batch, state_->config.seed));
  DRAY_ASSIGN_OR_RETURN(qwen_image::EditOptions options,
                        EditOptionsFor(state_->config, batch.meta_info()));
  if (state_->config.enable_cpu_offload)
    DRAY_RETURN_IF_ERROR(state_->MoveParameters(state_->device));
  std::vector<Image> edited;
  // Micro-batches of batch_size rows; the steps of all their denoising loops
  // make the call's progress.
  std::vector<std::vector<qwen_image::EditInput>> micro_batches;
  const size_t micro_batch = static_cast<size_t>(state_->config.batch_size);
  int64_t total_steps = 0;
  for (size_t start = 0; start < rows.size(); start += micro_batch) {
    std::vector<qwen_image::EditInput>& inputs = micro_batches.emplace_back();
    for (size_t i = start; i < std::min(rows.size(), start + micro_batch); ++i) {
      inputs.push_back({rows[i].image.to(state_->device), rows[i].instruction, rows[i].seed});
    }
    total_steps += qwen_image::DenoisingLoops(inputs) * options.num_inference_steps;
  }
  int64_t done_before = 0;
  for (const std::vector<qwen_image::EditInput>& inputs : micro_batches) {
    int64_t done = 0;
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> images,
                          state_->pipeline->Edit(inputs, options, [&](int step, int) {
                            done = step;
                            ReportProgress(kDenoisingProgress, done_before + step, total_steps);
                            return StopBetweenSteps(done_before + step, total_steps);
                          }));
    done_before += done;
    for (const at::Tensor& image : images) {
      DRAY_ASSIGN_OR_RETURN(std::string png, EncodePng(image.cpu()));
      edited.push_back({Image::Format::kPng, static_cast<int32_t>(image.size(1)),
                        static_cast<int32_t>(image.size(0)), 3, Bytes(std::move(png))});
    }
  }
  if (state_->config.enable_cpu_offload) DRAY_RETURN_IF_ERROR(state_->MoveParameters(at::kCPU));
  return DataProto::Make({}, {{kEditedColumn, std::move(edited)}});
}

}  // namespace dray
