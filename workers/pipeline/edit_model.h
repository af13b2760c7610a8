// EditModel: the image-edit model a worker process holds, as every worker
// class that runs it loads it: read from config.model_path, whose
// model_index.json names its family (Qwen-Image-Edit, or FLUX.1 Kontext;
// the embedded model, unpacked by this process, when it is empty; by rank
// 0 alone with fsdp_sync_module_states, the others building shape-only and
// receiving), the transformer's and (the larger) text encoder's blocks sharded with
// FSDP's design when enable_fsdp is set (the VAE is replicated; hybrid
// strategies shard within each node and replicate across nodes), and the
// edit pipeline over it. Each phase's memory is logged to stderr.
//
//   DRAY_ASSIGN_OR_RETURN(std::unique_ptr<EditModel> model,
//                         LoadEditModel(config, *this, [&](const EditModules& m) {
//                           return AddLoraAdapters(*m.transformer, lora, generator).status();
//                         }));
//   model->pipeline->Edit(...);  // Qwen-Image; model->kontext->Edit(...) for FLUX.1 Kontext
//
// Thread-safety: not thread-safe (the models are not).
#ifndef DRAY_WORKERS_PIPELINE_EDIT_MODEL_H_
#define DRAY_WORKERS_PIPELINE_EDIT_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "base/files.h"
#include "dispatch/data_proto.h"
#include "runtime/sharding/fully_sharded.h"
#include "runtime/worker/worker.h"
#include "workers/models/flux/kontext_pipeline.h"
#include "workers/models/model_index.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/pipeline/edit_config.h"

namespace dray {

// EditModules: a loaded model's parts, whatever its family.
struct EditModules {
  std::shared_ptr<torch::nn::Module> transformer;
  // The text encoder FSDP shards (Qwen2.5-VL; T5), then any other (CLIP).
  std::vector<std::shared_ptr<torch::nn::Module>> text_encoders;
  std::shared_ptr<torch::nn::Module> vae;
};

struct EditModel {
  ImageEditConfig config;              // model_path: where the weights were read
  std::optional<ScratchDir> embedded;  // the unpacked embedded model, if it is the one
  at::Device device{at::kCPU};
  // Declared before the pipeline, whose models call them: destroyed after it.
  std::unique_ptr<FullyShardedModule> transformer_shards, text_encoder_shards;
  // The config.RanksPerEdit() consecutive ranks that run each edit together
  // (null when one): all of them, over the CPU communicator (they agree on
  // their inputs and on stopping), the CFG pair and the Ulysses ranks, over
  // the device's.
  std::unique_ptr<Communicator> edit_group, cfg_group, sequence_group;
  ModelFamily family = ModelFamily::kQwenImage;
  // The family's pipeline: Qwen-Image-Edit's, or FLUX.1 Kontext's.
  std::unique_ptr<qwen_image::QwenImageEditPipeline> pipeline;
  std::unique_ptr<flux::FluxKontextPipeline> kontext;

  // model: the Qwen-Image model (the Qwen-Image family only).
  qwen_image::QwenImageModel& model() { return pipeline->model(); }
  EditModules modules();
  bool sharded() const { return transformer_shards != nullptr; }

  // BlockModelBytes: the parameter memory this rank holds of the models
  // FSDP shards (transformer and text encoder); the VAE is always whole.
  int64_t BlockModelBytes();
  int64_t ParameterBytes();
  // MemoryFigures: rank, parameter_bytes, block_model_parameter_bytes and
  // resident_bytes, as init_model returns them.
  MetaInfo MemoryFigures(int rank);

  // set_activation_checkpointing: the transformer recomputes each block in
  // backward instead of keeping its activations (training's
  // gradient_checkpointing).
  void set_activation_checkpointing(bool enabled);

  // MoveParameters puts every parameter (the shards, under FSDP) on `device`.
  absl::Status MoveParameters(at::Device device);
};

// ComputeDtype: the dtype config.torch_dtype names (validated).
at::ScalarType ComputeDtype(const ImageEditConfig& config);

// EditSharding: how `config` shards a model's blocks on `worker`'s group
// (strategy, offload, compute dtype; hybrid strategies shard within a node).
absl::StatusOr<ShardingOptions> EditSharding(const ImageEditConfig& config, const Worker& worker);

// BeforeSharding: a change to the loaded model before it is sharded (LoRA
// adapters, freezing what is not trained). Under FSDP a trainable parameter
// keeps a float32 master shard and computes in torch_dtype; a frozen one is
// stored in torch_dtype (it has no use for a float32 copy).
using BeforeSharding = std::function<absl::Status(const EditModules& modules)>;

// LoadEditModel loads the model `config` names into `worker`'s process (a
// collective when sharding or syncing: every rank calls it), ending with a
// barrier.
absl::StatusOr<std::unique_ptr<EditModel>> LoadEditModel(
    const ImageEditConfig& config, Worker& worker, const BeforeSharding& before_sharding = nullptr);

}  // namespace dray

#endif  // DRAY_WORKERS_PIPELINE_EDIT_MODEL_H_
