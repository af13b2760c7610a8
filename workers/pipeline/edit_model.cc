#include "workers/pipeline/edit_model.h"

#include <ATen/Context.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/log.h"
#include "base/process_memory.h"
#include "base/status_macros.h"
#include "runtime/sharding/replicate.h"
#include "workers/models/flux/model.h"
#include "workers/models/qwen_image/embedded_model.h"
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
  return at::Device(at::kCUDA, 0);
}

// Frozen: no parameter of `module` trains.
bool Frozen(const torch::nn::Module& module) {
  for (const at::Tensor& parameter : module.parameters()) {
    if (parameter.requires_grad()) return false;
  }
  return true;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Whole: every module of `modules`.
std::vector<std::shared_ptr<torch::nn::Module>> Whole(const EditModules& modules) {
  std::vector<std::shared_ptr<torch::nn::Module>> all = {modules.transformer, modules.vae};
  all.insert(all.end(), modules.text_encoders.begin(), modules.text_encoders.end());
  return all;
}

// Replicated: the modules FSDP does not shard (the VAE, text encoders after the first).
std::vector<std::shared_ptr<torch::nn::Module>> Replicated(const EditModules& modules) {
  std::vector<std::shared_ptr<torch::nn::Module>> replicated = {modules.vae};
  replicated.insert(replicated.end(), modules.text_encoders.begin() + 1,
                    modules.text_encoders.end());
  return replicated;
}

EditModules ModulesOf(const qwen_image::QwenImageModel& model) {
  return {model.transformer.ptr(), {model.text_encoder.ptr()}, model.vae.ptr()};
}

EditModules ModulesOf(const flux::FluxKontextModel& model) {
  return {model.transformer.ptr(), {model.t5.ptr(), model.clip.ptr()}, model.vae.ptr()};
}

int64_t ModelsBytes(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  int64_t bytes = 0;
  for (const auto& module : modules) bytes += ModuleBytes(*module);
  return bytes;
}

}  // namespace

void EditModel::set_activation_checkpointing(bool enabled) {
  if (family == ModelFamily::kFluxKontext) {
    kontext->model().transformer->set_activation_checkpointing(enabled);
  } else {
    model().transformer->set_activation_checkpointing(enabled);
  }
}

EditModules EditModel::modules() {
  return family == ModelFamily::kFluxKontext ? ModulesOf(kontext->model())
                                             : ModulesOf(pipeline->model());
}

int64_t EditModel::BlockModelBytes() {
  const EditModules parts = modules();
  if (transformer_shards == nullptr)
    return ModelsBytes({parts.transformer, parts.text_encoders[0]});
  return transformer_shards->LocalBytes().parameters + text_encoder_shards->LocalBytes().parameters;
}

int64_t EditModel::ParameterBytes() {
  return BlockModelBytes() + ModelsBytes(Replicated(modules()));
}

MetaInfo EditModel::MemoryFigures(int rank) {
  return {{"rank", int64_t{rank}},
          {"parameter_bytes", ParameterBytes()},
          {"block_model_parameter_bytes", BlockModelBytes()},
          {"resident_bytes", ResidentBytes()}};
}

absl::Status EditModel::MoveParameters(at::Device target) {
  torch::NoGradGuard no_grad;
  const EditModules parts = modules();
  if (transformer_shards != nullptr) {
    DRAY_RETURN_IF_ERROR(target.is_cpu() ? transformer_shards->Offload()
                                         : transformer_shards->Load(target));
    DRAY_RETURN_IF_ERROR(target.is_cpu() ? text_encoder_shards->Offload()
                                         : text_encoder_shards->Load(target));
  } else {
    parts.transformer->to(target);
    parts.text_encoders[0]->to(target);
  }
  for (const auto& module : Replicated(parts)) module->to(target);
  return absl::OkStatus();
}

at::ScalarType ComputeDtype(const ImageEditConfig& config) {
  const std::string& name = config.torch_dtype;
  if (name == "bfloat16") return at::kBFloat16;
  if (name == "float16") return at::kHalf;
  if (name == "float64") return at::kDouble;
  return at::kFloat;  // validated by ImageEditConfig
}

absl::StatusOr<ShardingOptions> EditSharding(const ImageEditConfig& config, const Worker& worker) {
  ShardingOptions sharding;
  DRAY_ASSIGN_OR_RETURN(sharding.strategy, ParseShardingStrategy(config.fsdp_sharding_strategy));
  sharding.shard_group_size = worker.local_world_size();  // hybrid: shard within a node
  sharding.cpu_offload = config.fsdp_cpu_offload;
  const at::ScalarType dtype = ComputeDtype(config);
  if (dtype != MasterDtype(dtype)) sharding.mixed_precision.param_dtype = dtype;
  return sharding;
}

namespace {

// JoinEditGroups makes `model`'s edit, CFG and Ulysses groups from
// consecutive ranks, and hands them to its pipeline and transformer.
absl::Status JoinEditGroups(EditModel& model, Worker& worker) {
  const int size = static_cast<int>(model.config.RanksPerEdit());
  if (size == 1) return absl::OkStatus();
  if (worker.world_size() % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(model.config.EditLayout(), ": each edit takes ",
                                                   size, " ranks, which do not divide the ",
                                                   worker.world_size()));
  }
  // [first, first + size): the CFG branch r's Ulysses ranks from
  // first + r x ulysses_degree on.
  const int first = worker.rank() / size * size, ulysses = model.config.ulysses_degree;
  const int branch = (worker.rank() - first) / ulysses, part = (worker.rank() - first) % ulysses;
  auto every = [](int from, int count, int stride) {
    std::vector<int> ranks;
    for (int i = 0; i < count; ++i) ranks.push_back(from + i * stride);
    return ranks;
  };
  DRAY_ASSIGN_OR_RETURN(Communicator * world, worker.comm());
  DRAY_ASSIGN_OR_RETURN(model.edit_group, world->Subgroup(every(first, size, 1), "edit"));
  DRAY_ASSIGN_OR_RETURN(Communicator * devices,
                        model.device.is_cuda() ? worker.device_comm() : worker.comm());
  if (model.config.cfg_parallel_size == 2) {
    DRAY_ASSIGN_OR_RETURN(model.cfg_group,
                          devices->Subgroup(every(first + part, 2, ulysses), "cfg"));
    model.pipeline->set_cfg_group(model.cfg_group.get());
  }
  if (ulysses > 1) {
    DRAY_ASSIGN_OR_RETURN(
        model.sequence_group,
        devices->Subgroup(every(first + branch * ulysses, ulysses, 1), "ulysses"));
    DRAY_RETURN_IF_ERROR(model.model().transformer->set_sequence_group(model.sequence_group.get()));
  }
  return absl::OkStatus();
}

// LoadedModel: a model read from its directory, before sharding.
struct LoadedModel {
  EditModules modules;
  // The blocks FSDP shards, of the transformer and of the first text encoder.
  std::vector<std::shared_ptr<torch::nn::Module>> transformer_blocks, text_encoder_blocks;
  // SetUnitHooks hands the two models their shards.
  std::function<void(UnitHooks* transformer, UnitHooks* text_encoder)> set_unit_hooks;
  // Adopt moves the model into `state`'s pipeline.
  std::function<void(EditModel& state)> adopt;
};

absl::StatusOr<LoadedModel> LoadQwenImage(const std::string& dir, at::TensorOptions options,
                                          Weights weights) {
  DRAY_ASSIGN_OR_RETURN(qwen_image::QwenImageModel read,
                        qwen_image::LoadQwenImageModel(dir, options, weights));
  auto model = std::make_shared<qwen_image::QwenImageModel>(std::move(read));
  LoadedModel loaded{ModulesOf(*model),
                     {model->transformer->blocks()->begin(), model->transformer->blocks()->end()},
                     model->text_encoder->blocks()};
  loaded.set_unit_hooks = [model](UnitHooks* transformer, UnitHooks* text_encoder) {
    model->transformer->set_unit_hooks(transformer);
    model->text_encoder->set_unit_hooks(text_encoder);
  };
  loaded.adopt = [model](EditModel& state) {
    state.pipeline = std::make_unique<qwen_image::QwenImageEditPipeline>(std::move(*model));
  };
  return loaded;
}

absl::StatusOr<LoadedModel> LoadFluxKontext(const std::string& dir, at::TensorOptions options,
                                            Weights weights) {
  DRAY_ASSIGN_OR_RETURN(flux::FluxKontextModel read,
                        flux::LoadFluxKontextModel(dir, options, weights));
  auto model = std::make_shared<flux::FluxKontextModel>(std::move(read));
  LoadedModel loaded{ModulesOf(*model), model->transformer->blocks(), model->t5->blocks()};
  loaded.set_unit_hooks = [model](UnitHooks* transformer, UnitHooks* text_encoder) {
    model->transformer->set_unit_hooks(transformer);
    model->t5->set_unit_hooks(text_encoder);
  };
  loaded.adopt = [model](EditModel& state) {
    state.kontext = std::make_unique<flux::FluxKontextPipeline>(std::move(*model));
  };
  return loaded;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EditModel>> LoadEditModel(const ImageEditConfig& config,
                                                         Worker& worker,
                                                         const BeforeSharding& before_sharding) {
  auto state = std::make_unique<EditModel>();
  state->config = config;
  if (config.model_path.empty()) {  // the embedded model: each node needs its own copy
    DRAY_ASSIGN_OR_RETURN(state->embedded, ScratchDir::Create("dray-tiny"));
    DRAY_RETURN_IF_ERROR(qwen_image::WriteEmbeddedModel(state->embedded->path()));
    state->config.model_path = state->embedded->path();
  }
  DRAY_ASSIGN_OR_RETURN(state->family, ReadModelFamily(state->config.model_path));
  DRAY_RETURN_IF_ERROR(config.CheckFamily(state->family));
  DRAY_ASSIGN_OR_RETURN(state->device, ParseDevice(config.device));
  const at::ScalarType dtype = ComputeDtype(config);
  auto log = [&](const char* phase, int64_t parameter_bytes) {
    Log("worker", absl::StrFormat("init_model: %-26s resident %8.1f MiB, parameters %8.1f MiB",
                                  phase, MiB(ResidentBytes()), MiB(parameter_bytes)));
  };
  log("start", 0);

  // With sync_module_states only rank 0 reads the weights; the others build
  // shape-only and receive them. Under FSDP torch_dtype is the compute
  // dtype (mixed precision) over float32 masters of what trains (float64
  // computes over float64 masters).
  const int world = worker.world_size(), rank = worker.rank();
  const bool receives = config.fsdp_sync_module_states && world > 1 && rank != 0;
  const bool sends = config.fsdp_sync_module_states && world > 1;
  const at::TensorOptions options = at::TensorOptions()
                                        .device(state->device)
                                        .dtype(config.enable_fsdp ? MasterDtype(dtype) : dtype);
  const Weights weights = receives ? Weights::kShapeOnly : Weights::kRead;
  DRAY_ASSIGN_OR_RETURN(LoadedModel loaded,
                        state->family == ModelFamily::kFluxKontext
                            ? LoadFluxKontext(state->config.model_path, options, weights)
                            : LoadQwenImage(state->config.model_path, options, weights));
  const EditModules& modules = loaded.modules;
  log(receives ? "built shape-only" : "weights read", ModelsBytes(Whole(modules)));
  if (before_sharding) DRAY_RETURN_IF_ERROR(before_sharding(modules));

  Communicator* group = nullptr;
  if (sends || config.enable_fsdp) {
    DRAY_ASSIGN_OR_RETURN(group, state->device.is_cuda() ? worker.device_comm() : worker.comm());
  }
  if (config.enable_fsdp) {
    DRAY_ASSIGN_OR_RETURN(ShardingOptions sharding, EditSharding(config, worker));
    sharding.sync_module_states = sends;
    DRAY_ASSIGN_OR_RETURN(
        state->transformer_shards,
        FullyShardedModule::Shard(modules.transformer, loaded.transformer_blocks, group, sharding));
    DRAY_ASSIGN_OR_RETURN(state->text_encoder_shards,
                          FullyShardedModule::Shard(modules.text_encoders[0],
                                                    loaded.text_encoder_blocks, group, sharding));
    loaded.set_unit_hooks(state->transformer_shards.get(), state->text_encoder_shards.get());
    for (const auto& module : Replicated(modules)) {
      if (sends) DRAY_RETURN_IF_ERROR(BroadcastModule(*module, group));
      if (dtype != MasterDtype(dtype) && Frozen(*module)) module->to(dtype);  // else FSDP's masters
    }
  } else if (sends) {
    for (const auto& module : Whole(modules)) DRAY_RETURN_IF_ERROR(BroadcastModule(*module, group));
  }
  loaded.adopt(*state);
  DRAY_RETURN_IF_ERROR(JoinEditGroups(*state, worker));
  log(state->sharded() ? "sharded" : sends ? "received" : "ready", state->ParameterBytes());
  if (config.enable_cpu_offload) {
    DRAY_RETURN_IF_ERROR(state->MoveParameters(at::kCPU));
    log("offloaded to CPU", state->ParameterBytes());
  }
  if (group != nullptr) DRAY_RETURN_IF_ERROR(group->Barrier());
  return state;
}

}  // namespace dray
