// QwenImageEditWorker: the worker class behind dray's image editing, one
// process per GPU, each holding the image-edit model its model directory
// names (Qwen-Image-Edit, or FLUX.1 Kontext; sharded with FSDP's design
// when enable_fsdp is set):
//
//   init_model         ONE_TO_ALL        meta "config": the resolved ImageEditConfig
//                                        (ToYaml); returns as meta this rank's
//                                        parameter_bytes, block_model_parameter_bytes
//                                        (transformer and text encoder) and resident_bytes
//   edit_images_batch  DP_COMPUTE_PROTO  the columns of edit_batch.h: images and
//   process_batch      (the same)        instructions in, PNG images out (and
//                                        each row's transformer passes, those
//                                        a step cache reused)
//
// init_model: rank 0 reads the weights; with fsdp_sync_module_states the
// other ranks build the model shape-only and receive rank 0's weights (each
// keeping only its shards of the transformer's and text encoder's blocks;
// the VAE is replicated); without it every rank reads the weights itself.
// A barrier ends it, and each phase's memory is logged.
//
// edit_images_batch reports each denoising step (ReportProgress, as
// "denoising": steps done of all its micro-batches' steps) and, between
// steps, stops when its caller cancels it or its deadline passes (sharded
// ranks agree to stop together).
//
// With cfg_parallel_size 2 each edit runs on two ranks at once (the
// prompt's pass on one, the negative prompt's on the other), with
// ulysses_degree P on P ranks each holding part of the image tokens, with
// both on 2 x P: the ranks of an edit are consecutive, must be given the
// same rows (CallOptions::rank_group_size, as ImageEditController calls),
// and the first of them answers.
//
// With enable_cpu_offload the parameters (the shards, under FSDP) wait in
// CPU memory between calls and move to the device for each call.
#ifndef DRAY_WORKERS_EDIT_IMAGE_EDIT_WORKER_H_
#define DRAY_WORKERS_EDIT_IMAGE_EDIT_WORKER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "dispatch/data_proto.h"
#include "runtime/worker/worker.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {

struct EditModel;

// kImageEditRole: the role QwenImageEditWorker is registered under.
inline constexpr char kImageEditRole[] = "image_edit";
// kDenoisingProgress: what edit_images_batch's progress reports count.
inline constexpr char kDenoisingProgress[] = "denoising";

class QwenImageEditWorker : public Worker {
 public:
  QwenImageEditWorker();
  ~QwenImageEditWorker() override;

  absl::StatusOr<DataProto> InitModel(const DataProto& input);
  absl::StatusOr<DataProto> EditImagesBatch(const DataProto& batch);

 private:
  // AgreedStop: Worker::StopRequested agreed by every rank that computes
  // with this one (all shards, or the ranks of one edit), or OK.
  absl::Status AgreedStop();
  // StopBetweenSteps: AgreedStop after step `done` of `steps`.
  absl::Status StopBetweenSteps(int64_t done, int64_t steps);
  // CheckSameRows: FAILED_PRECONDITION unless every rank of this rank's
  // edit group was given the same rows (the group computes them together).
  absl::Status CheckSameRows(const std::vector<EditRow>& rows);

  // EditRows edits `rows` (micro-batches of batch_size) with the Qwen-Image
  // pipeline, EditKontextRows with FLUX.1 Kontext's (each row at its own
  // input's aspect ratio); both return edit_images_batch's answer.
  absl::StatusOr<DataProto> EditRows(const std::vector<EditRow>& rows, const MetaInfo& meta);
  absl::StatusOr<DataProto> EditKontextRows(const std::vector<EditRow>& rows, const MetaInfo& meta);
  // Answer: the edited images and each row's transformer passes (and those
  // a step cache reused), as edit_images_batch returns them.
  absl::StatusOr<DataProto> Answer(const std::vector<at::Tensor>& images, at::Tensor counts);

  std::unique_ptr<EditModel> model_;  // set by init_model
  qwen_image::EditPipelineKind pipeline_kind_ = qwen_image::EditPipelineKind::kEdit;
  PromptTokenCounter count_tokens_;
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_IMAGE_EDIT_WORKER_H_
