#include "workers/train/transformer_copy.h"

#include <vector>

#include "base/status_macros.h"
#include "workers/models/component_weights.h"
#include "workers/models/layers.h"

namespace dray {

absl::StatusOr<TransformerCopy> LoadTransformerCopy(EditModel& model, Worker& worker,
                                                    bool trainable,
                                                    const ImageEditConfig& sharding_config,
                                                    const AddParts& add_parts) {
  const qwen_image::QwenImageTransformerImpl& original = *model.model().transformer;
  const at::ScalarType masters = MasterDtype(ComputeDtype(sharding_config));
  TransformerCopy copy;
  {
    DeferredAllocation shape_only;
    copy.transformer = qwen_image::QwenImageTransformer(
        original.config(), at::TensorOptions().device(model.device).dtype(masters));
  }
  for (auto& parameter : copy.transformer->parameters()) parameter.set_requires_grad(trainable);
  std::set<std::string> added;
  if (add_parts) {
    DRAY_ASSIGN_OR_RETURN(added, add_parts(*copy.transformer));
  }
  DRAY_ASSIGN_OR_RETURN(ShardingOptions sharding, EditSharding(sharding_config, worker));
  DRAY_ASSIGN_OR_RETURN(Communicator * group,
                        model.device.is_cuda() ? worker.device_comm() : worker.comm());
  std::vector<std::shared_ptr<torch::nn::Module>> blocks(copy.transformer->blocks()->begin(),
                                                         copy.transformer->blocks()->end());
  DRAY_ASSIGN_OR_RETURN(copy.shards,
                        FullyShardedModule::Shard(copy.transformer.ptr(), blocks, group, sharding));
  DRAY_ASSIGN_OR_RETURN(Checkpoint weights,
                        OpenComponentWeights(model.config.model_path + "/transformer"));
  DRAY_RETURN_IF_ERROR(copy.shards->LoadShards(weights, added));
  copy.transformer->set_unit_hooks(copy.shards.get());
  return copy;
}

}  // namespace dray
