// TransformerCopy: a second transformer beside a worker's model, of the
// model's config on its device, its weights read from the model directory
// and sharded as the model's blocks are: frozen (full fine-tuning's
// reference policy, DMD2's real score) or trainable (DMD2's fake score,
// with an optimizer of its own).
//
//   DRAY_ASSIGN_OR_RETURN(TransformerCopy fake,
//                         LoadTransformerCopy(model, worker, /*trainable=*/true, sharding));
//   velocity = pipeline.Velocity(prepared, latents, t, 1.0,
//   qwen_image::DenoiserOf(*fake.transformer));
//
// Thread-safety: not thread-safe (modules are not).
#ifndef DRAY_WORKERS_TRAIN_TRANSFORMER_COPY_H_
#define DRAY_WORKERS_TRAIN_TRANSFORMER_COPY_H_

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/sharding/fully_sharded.h"
#include "runtime/worker/worker.h"
#include "workers/models/qwen_image/transformer.h"
#include "workers/pipeline/edit_model.h"

namespace dray {

struct TransformerCopy {
  // Declared first: the shards outlive the module's hooks.
  std::unique_ptr<FullyShardedModule> shards;
  qwen_image::QwenImageTransformer transformer{nullptr};

  bool loaded() const { return !transformer.is_empty(); }
};

// LoadTransformerCopy builds the copy shape-only, shards it as `sharding`'s
// fsdp_sharding_strategy, fsdp_cpu_offload and torch_dtype say (the
// model's own config, or DMD2's score models' variants of it: a
// collective, every rank calls it) and fills each rank's shards from the
// model directory's transformer weights. A trainable copy keeps float32
// masters and computes in torch_dtype; a frozen one is stored in it.
//
// `add_parts`, when given, adds what the model directory does not hold
// (DMD2's classifier head) to the built copy before it is sharded and
// returns those parameters' names: they keep the values it gave them.
using AddParts = std::function<absl::StatusOr<std::set<std::string>>(
    qwen_image::QwenImageTransformerImpl& transformer)>;
absl::StatusOr<TransformerCopy> LoadTransformerCopy(EditModel& model, Worker& worker,
                                                    bool trainable, const ImageEditConfig& sharding,
                                                    const AddParts& add_parts = nullptr);

}  // namespace dray

#endif  // DRAY_WORKERS_TRAIN_TRANSFORMER_COPY_H_
