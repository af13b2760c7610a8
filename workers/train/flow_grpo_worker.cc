#include "workers/train/flow_grpo_worker.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "runtime/io/safetensors.h"
#include "runtime/sharding/optimizer_state.h"
#include "workers/models/component_weights.h"
#include "workers/models/image_resize.h"
#include "workers/models/layers.h"
#include "workers/models/lora.h"
#include "workers/models/pixels.h"
#include "workers/models/qwen_image/pipeline_helpers.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_diffusion.h"
#include "workers/pipeline/edit_model.h"
#include "workers/rl/dmd2.h"
#include "workers/rl/dpo_loss.h"
#include "workers/rl/nft_loss.h"
#include "workers/rl/ode_sampler.h"
#include "workers/rl/policy_loss.h"
#include "workers/rl/sde_sampler.h"
#include "workers/rl/sde_step.h"
#include "workers/train/dmd2_classifier.h"
#include "workers/train/sft.h"
#include "workers/train/train_config.h"
#include "workers/train/transformer_copy.h"
#include "workers/train/vae_training.h"

namespace dray {
namespace {

// kSdeNoiseStream: offset of a row's SDE noise seed from its initial-noise
// seed, so the two streams never coincide.
constexpr uint64_t kSdeNoiseStream = uint64_t{1} << 40;
// kDpoNoiseStream: offset of a pair's DPO noise seeds (one per draw) from its
// row's seed.
constexpr uint64_t kDpoNoiseStream = uint64_t{2} << 40;
// kNftNoiseStream: offset of a row's DiffusionNFT noise seeds (one per inner
// epoch and trained timestep) from its seed.
constexpr uint64_t kNftNoiseStream = uint64_t{3} << 40;
// kDmd2Stream: offset of a row's DMD2 draws from its seed: the start noise
// of backward simulation, its re-noising draws (1 + i after step i), and
// the noise levels and noise of the distribution-matching and fake-score
// losses (the kDmd2* offsets below).
constexpr uint64_t kDmd2Stream = uint64_t{4} << 40;
constexpr uint64_t kDmd2MatchingLevel = 1000, kDmd2MatchingNoise = 1001;
constexpr uint64_t kDmd2FakeLevel = 1002, kDmd2FakeNoise = 1003;
// The GAN's diffusion noise: a level and a noise draw each for the
// generator's turn, the fake samples' and the real images'.
constexpr uint64_t kDmd2GanGenerator = 1004, kDmd2GanFake = 1006, kDmd2GanReal = 1008;
constexpr char kLoraFile[] = "pytorch_lora_weights.safetensors";
// kSamplingPolicyName: diffusion_nft's sampling policy's files in a checkpoint.
constexpr char kSamplingPolicyName[] = "sampling_policy";
// kFakeScoreDir: dmd2's fake score's shards and AdamW state in a checkpoint.
constexpr char kFakeScoreDir[] = "fake_score";

// SecondsIn adds the time until it goes out of scope to `table[name]`.
class SecondsIn {
 public:
  SecondsIn(MetaInfo& table, const char* name)
      : total_(table.emplace(name, 0.0).first->second), start_(absl::Now()) {}
  ~SecondsIn() { total_ = std::get<double>(total_) + absl::ToDoubleSeconds(absl::Now() - start_); }

 private:
  MetaValue& total_;
  absl::Time start_;
};

// Micro-batch: rows of a batch processed together, with their trajectory.
struct MicroBatch {
  std::vector<qwen_image::EditInput> inputs;
  rl::Trajectory trajectory;
  at::Tensor advantages;
  at::Tensor train_steps;            // [b, K]: each row's own trained steps, where given
  at::Tensor behaviour_log_probs;    // [b, T]: an adopted rollout's sampling policy's
  at::Tensor rollout_rows;           // [b]: the rows' places in the kept rollout
  std::vector<int64_t> sde_seeds;    // where they differ from the inputs' seeds (kSdeSeedsColumn)
  std::vector<at::Tensor> targets;   // SFT: the edited images asked for (DPO: the chosen ones)
  std::vector<at::Tensor> rejected;  // DPO: the edits the targets are preferred over
  at::Tensor sigma_draws;            // SFT: where in the schedule each row is noised
};

// RawImage: an RGB uint8 [H, W, 3] image as a raw image row.
Image RawImage(const at::Tensor& image) {
  const at::Tensor pixels = image.cpu().contiguous();
  return {Image::Format::kRaw, static_cast<int32_t>(pixels.size(1)),
          static_cast<int32_t>(pixels.size(0)), 3,
          Bytes(std::string(static_cast<const char*>(pixels.data_ptr()), pixels.nbytes()))};
}

// RowsNoise: a standard normal draw of `shape` (one row's, without the
// batch dimension) for each row, from a generator seeded with the row's
// seed + `offset`, stacked on `device`.
at::Tensor RowsNoise(const std::vector<qwen_image::EditInput>& inputs, uint64_t offset,
                     at::IntArrayRef shape, at::Device device) {
  std::vector<int64_t> row_shape = {1};
  row_shape.insert(row_shape.end(), shape.begin(), shape.end());
  std::vector<uint64_t> seeds;
  for (const qwen_image::EditInput& input : inputs) seeds.push_back(input.seed + offset);
  return qwen_image::SeededNoise(seeds, row_shape, at::TensorOptions(device).dtype(at::kFloat));
}

// RowsTimesteps: a train timestep in [lo, hi) for each row, from a
// generator seeded with the row's seed + `offset` (int64 [B], on the CPU).
at::Tensor RowsTimesteps(const std::vector<qwen_image::EditInput>& inputs, uint64_t offset,
                         int64_t lo, int64_t hi) {
  std::vector<at::Tensor> drawn;
  for (const qwen_image::EditInput& input : inputs) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(input.seed + offset);
    drawn.push_back(at::randint(lo, hi, {1}, generator, at::kLong));
  }
  return at::cat(drawn);
}

// kTrainTimesteps: the schedule SFT draws its noise levels from, as
// diffusers' training scripts draw from the scheduler's 1000 timesteps
// (and DMD2's train timesteps).
constexpr int kTrainTimesteps = 1000;

}  // namespace

struct FlowGrpoWorker::State {
  TrainConfig config;
  std::unique_ptr<EditModel> model;
  // algorithm.name vae: the VAE, sharded as one unit (the pipeline cannot
  // use it then: only VaeLossOf runs it, between the unit's hooks).
  std::unique_ptr<FullyShardedModule> vae_shards;
  // Full fine-tuning with a KL term (DPO's, DMD2's real score): a frozen,
  // sharded copy of the initial transformer.
  TransformerCopy reference;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  // DMD2's fake score: a trainable copy of the initial transformer, with
  // an AdamW of its own (algorithm.guidance_lr).
  TransformerCopy fake_score;
  std::unique_ptr<torch::optim::AdamW> fake_optimizer;
  // DMD2's GAN classifier head (cls_on_clean_image): a part of the fake
  // score's module, trained and checkpointed with it.
  Dmd2Classifier classifier{nullptr};

  // AddClassifier adds the GAN's head to the fake score before it is
  // sharded (initialized from trainer.seed, the same on every rank).
  absl::StatusOr<std::set<std::string>> AddClassifier(qwen_image::QwenImageTransformerImpl& fake) {
    classifier = Dmd2Classifier(
        fake.config().inner_dim(),
        at::TensorOptions().device(model->device).dtype(fake.parameters()[0].scalar_type()));
    InitializeLikePyTorch(*classifier, at::make_generator<at::CPUGeneratorImpl>(config.seed));
    fake.register_module(kDmd2ClassifierName, classifier);
    std::set<std::string> names;
    for (const auto& parameter : classifier->named_parameters())
      names.insert(absl::StrCat(kDmd2ClassifierName, ".", parameter.key()));
    return names;
  }
  rl::SdeSamplerOptions sampler;
  rl::PolicyLoss loss;
  qwen_image::EditOptions options;  // the rollout's: steps, resolution, guidance
  // The current step's prompt and image encodings on this rank: made by
  // rollout, reused by compute_log_prob and update_actor.
  qwen_image::ConditionCache conditions;
  // The last rollout's rows on this rank, in order, and their trajectory
  // (on the device): what compute_log_prob and
  // update_actor pick rows of by kRolloutRowColumn.
  std::vector<qwen_image::EditInput> rollout_inputs;
  rl::Trajectory rollout;
  // An adopted rollout's (trainer.async): the log-probs of the policy that
  // sampled it (rollout.log_probs then holds this policy's, recomputed
  // before its first update).
  at::Tensor behaviour_log_probs;
  // Whether update_actor has not yet run on the last rollout: its first
  // pass measures the rollout-vs-training log-prob gap.
  bool first_update = true;
  // The sampling policy (config.sampling_policy(): DiffusionNFT's "old"
  // adapter, or DPO's refreshed reference, flow_grpo's "ref" adapter), its
  // values laid out like trained().shards(), swapped in for its rollouts
  // and its velocities in the loss; and diffusion_nft's rollouts' solver.
  std::vector<at::Tensor> sampling_policy;
  rl::OdeSolver ode_solver = rl::OdeSolver::kDpm2;

  // The model's denoising (either family), made once the model is loaded.
  std::optional<EditDiffusion> diffusion;
  // trained: the sharded module the optimizer updates.
  FullyShardedModule& trained() { return vae_shards ? *vae_shards : *model->transformer_shards; }

  // ShardVae makes the VAE trainable: one sharding unit of all its modules.
  absl::Status ShardVae(Worker& worker) {
    qwen_image::AutoencoderKLQwenImage& vae = model->model().vae;
    DRAY_ASSIGN_OR_RETURN(ShardingOptions sharding, EditSharding(model->config, worker));
    DRAY_ASSIGN_OR_RETURN(Communicator * group,
                          model->device.is_cuda() ? worker.device_comm() : worker.comm());
    const std::vector<std::vector<std::shared_ptr<torch::nn::Module>>> one_unit(1, vae->children());
    DRAY_ASSIGN_OR_RETURN(vae_shards,
                          FullyShardedModule::Shard(vae.ptr(), one_unit, group, sharding));
    return absl::OkStatus();
  }

  // VaeLossOf runs the sharded VAE on `images` (resized to the job's
  // resolution), each row's latent noise drawn from its seed (no seeds, or
  // algorithm.beta 0, a plain autoencoder: the posterior's mean).
  absl::StatusOr<VaeLoss> VaeLossOf(const std::vector<at::Tensor>& images,
                                    const std::vector<int64_t>& seeds) {
    std::vector<at::Tensor> resized;
    for (const at::Tensor& image : images) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor pixels, ResizeImage(image, config.resolution,
                                                           config.resolution, Resample::kLanczos));
      resized.push_back(pixels);
    }
    const at::TensorOptions compute = model->model().vae->parameters()[0].options();
    const at::Tensor pixels = qwen_image::ToPixels(resized, compute);
    const int64_t side = config.resolution / model->pipeline->vae_scale_factor();
    const int64_t channels = model->model().vae->config().z_dim;
    std::vector<at::Tensor> eps;
    for (size_t i = 0; i < images.size(); ++i) {
      if (seeds.empty() || config.beta == 0) {
        eps.push_back(at::zeros({1, channels, 1, side, side}));
        continue;
      }
      at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seeds[i]);
      eps.push_back(at::randn({1, channels, 1, side, side}, generator, at::kFloat));
    }
    vae_shards->BeforeForward();
    vae_shards->BeforeUnit(0);
    absl::StatusOr<VaeLoss> out = VaeReconstructionLoss(
        *model->model().vae, pixels, at::cat(eps).to(model->device), config.beta);
    std::vector<at::Tensor> outputs;
    if (out.ok()) outputs.push_back(out->loss);
    vae_shards->AfterUnit(model->model().vae->children().size() - 1, outputs);
    return out;
  }

  // Schedule: the sampler's schedule for latents of `tokens` tokens (the
  // model's scheduler's, or DanceGRPO's).
  absl::StatusOr<rl::SdeSchedule> Schedule(int64_t tokens) {
    if (config.name == "dance_grpo") {  // DanceGRPO's own shifted schedule
      const rl::SdeSchedule dance =
          rl::DanceGrpoSchedule(options.num_inference_steps, config.shift);
      return rl::SdeSchedule{dance.sigmas.to(model->device), dance.timesteps};
    }
    DRAY_ASSIGN_OR_RETURN(qwen_image::FlowMatchEulerScheduler scheduler,
                          diffusion->Scheduler(tokens, options.num_inference_steps));
    return rl::SdeSchedule{scheduler.sigmas().to(model->device), scheduler.timesteps()};
  }

  // WithSamplingPolicy runs `run` without gradients with the sampling
  // policy's values in the trained shards (FSDP gathers units from the
  // shards at each forward), then puts the trained values back.
  template <typename Run>
  auto WithSamplingPolicy(const Run& run) {
    torch::NoGradGuard no_grad;
    SwapSamplingPolicy();
    struct SwapBack {  // also when `run` throws
      State* state;
      ~SwapBack() { state->SwapSamplingPolicy(); }
    } swap_back{this};
    return run();
  }

  void SwapSamplingPolicy() {
    const std::vector<at::Tensor> shards = trained().shards();
    for (size_t i = 0; i < shards.size(); ++i) {
      const at::Tensor held = shards[i].detach().clone();
      shards[i].detach().copy_(sampling_policy[i]);
      sampling_policy[i].copy_(held);
    }
  }

  // RefreshWhenAsked makes the sampling policy the policy when `batch` asks
  // (DPO's reference, every ref_update_step steps).
  void RefreshWhenAsked(const DataProto& batch) {
    if (!sampling_policy.empty() && batch.GetMeta<bool>(kRefreshSamplingPolicyKey).value_or(false))
      BlendSamplingPolicy(0.0);
  }

  // BlendSamplingPolicy moves the sampling policy toward the trained one:
  // DiffusionNFT's update after each step (rl::NftBlendedPolicy).
  void BlendSamplingPolicy(double decay) {
    torch::NoGradGuard no_grad;
    const std::vector<at::Tensor> shards = trained().shards();
    for (size_t i = 0; i < shards.size(); ++i)
      sampling_policy[i] = rl::NftBlendedPolicy(sampling_policy[i], shards[i].detach(), decay);
  }

  // Sample rolls a micro-batch out: with the SDE sampler (by the sampling
  // policy, where the job keeps one), or diffusion_nft's sampling policy
  // with its ODE solver (no window: T = 0).
  absl::StatusOr<rl::Trajectory> Sample(const rl::SdeSchedule& schedule,
                                        const PreparedRows& prepared, const rl::DrawNoise& draw,
                                        const rl::SdeSamplerOptions& options,
                                        const std::function<absl::Status(int, int)>& on_step) {
    auto sample = [&]() -> absl::StatusOr<rl::Trajectory> {
      if (!config.nft()) {
        return rl::SampleTrajectory(schedule, prepared.noise(), Predictor(prepared), draw, options,
                                    on_step);
      }
      DRAY_ASSIGN_OR_RETURN(
          at::Tensor clean,
          rl::SampleOde(schedule, prepared.noise(), Predictor(prepared), ode_solver, on_step));
      return rl::OdeTrajectory(clean, schedule);
    };
    return config.sampling_policy() ? WithSamplingPolicy(sample) : sample();
  }

  // Predictor: the guided velocity for a prepared micro-batch, of the policy
  // or, with `denoiser`, of another copy.
  rl::PredictVelocity Predictor(const PreparedRows& prepared,
                                qwen_image::Denoiser denoiser = nullptr) {
    return [this, &prepared, denoiser](const at::Tensor& latents, const at::Tensor& timestep) {
      return diffusion->Velocity(prepared, latents, timestep, options.true_cfg_scale, denoiser);
    };
  }

  // AsReference runs `run` with the reference policy's denoiser (DPO's
  // refreshed copy: the policy's with the sampling policy's weights; the
  // frozen copy's; with LoRA, nullptr: the policy's own with its adapters
  // off), without gradients.
  template <typename Run>
  auto AsReference(const Run& run) {
    torch::NoGradGuard no_grad;
    if (config.dpo() && config.sampling_policy())
      return WithSamplingPolicy([&] { return run(qwen_image::Denoiser(nullptr)); });
    if (reference.loaded()) return run(qwen_image::DenoiserOf(*reference.transformer));
    torch::nn::Module& transformer = *model->modules().transformer;
    SetLoraEnabled(transformer, false);
    auto result = run(qwen_image::Denoiser(nullptr));
    SetLoraEnabled(transformer, true);
    return result;
  }

  // ReferenceStep: each row's window step `j` under the reference policy,
  // without gradients.
  absl::StatusOr<rl::SdeStepResult> ReferenceStep(const rl::SdeSchedule& schedule,
                                                  const PreparedRows& prepared,
                                                  const MicroBatch& micro, const at::Tensor& j) {
    return AsReference([&](qwen_image::Denoiser denoiser) {
      return rl::RecomputeStep(schedule, Predictor(prepared, denoiser), micro.trajectory, j,
                               sampler);
    });
  }

  // MicroBatches splits a batch's rows (with SFT's columns, when it has them).
  absl::StatusOr<std::vector<MicroBatch>> MicroBatches(const DataProto& batch) {
    DRAY_ASSIGN_OR_RETURN(std::vector<EditRow> rows, DecodeEditRows(batch, config.seed));
    std::vector<MicroBatch> out;
    for (size_t start = 0; start < rows.size(); start += config.micro_batch_size) {
      const int64_t end = std::min<int64_t>(rows.size(), start + config.micro_batch_size);
      MicroBatch& micro = out.emplace_back();
      for (int64_t i = start; i < end; ++i)
        micro.inputs.push_back({rows[i].images, rows[i].instruction, rows[i].seed});  // on the CPU
      auto rows_of = [&](const char* column) -> absl::StatusOr<at::Tensor> {
        DRAY_ASSIGN_OR_RETURN(at::Tensor all, batch.GetTensor(column));
        return all.slice(0, start, end).to(model->device);
      };
      for (const auto& [column, decoded] : {std::pair{kTargetsColumn, &micro.targets},
                                            std::pair{kRejectedColumn, &micro.rejected}}) {
        if (!batch.HasColumn(column)) continue;
        DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* images, batch.GetRows<Image>(column));
        for (int64_t i = start; i < end; ++i) {
          absl::StatusOr<at::Tensor> image = DecodeImageRow((*images)[i]);
          if (!image.ok()) {
            return absl::InvalidArgumentError(
                absl::StrCat("row ", i, ": ", column, ": ", image.status().message()));
          }
          decoded->push_back(*std::move(image));
        }
      }
      if (batch.HasColumn(kSdeSeedsColumn)) {
        DRAY_ASSIGN_OR_RETURN(const std::vector<int64_t>* seeds,
                              batch.GetRows<int64_t>(kSdeSeedsColumn));
        micro.sde_seeds.assign(seeds->begin() + start, seeds->begin() + end);
      }
      if (batch.HasColumn(kSigmaDrawsColumn)) {
        DRAY_ASSIGN_OR_RETURN(micro.sigma_draws, rows_of(kSigmaDrawsColumn));
      }
    }
    return out;
  }

  // KeptMicroBatches: the rows of the last rollout that `batch`'s
  // kRolloutRowColumn names, in that order, with their trajectory (and the
  // batch's advantages, when it has them), split into micro-batches.
  absl::StatusOr<std::vector<MicroBatch>> KeptMicroBatches(const DataProto& batch) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor picked, batch.GetTensor(kRolloutRowColumn));
    const int64_t kept = static_cast<int64_t>(rollout_inputs.size());
    if (picked.dim() != 1 || picked.scalar_type() != at::kLong) {
      return absl::InvalidArgumentError(absl::StrCat(kRolloutRowColumn, " must be int64 [B]"));
    }
    for (int64_t i = 0; i < picked.size(0); ++i) {
      const int64_t row = picked[i].item<int64_t>();
      if (row < 0 || row >= kept) {
        return absl::InvalidArgumentError(
            absl::StrCat("row ", i, ": ", kRolloutRowColumn, " ", row, " is not among the ", kept,
                         " rows of this rank's last rollout",
                         kept == 0 ? " (no rollout since init_model or a failed one)" : ""));
      }
    }
    std::vector<MicroBatch> out;
    for (int64_t start = 0; start < picked.size(0); start += config.micro_batch_size) {
      const int64_t end = std::min<int64_t>(picked.size(0), start + config.micro_batch_size);
      const at::Tensor rows = picked.slice(0, start, end);
      MicroBatch& micro = out.emplace_back();
      micro.rollout_rows = rows;
      for (int64_t i = 0; i < rows.size(0); ++i)
        micro.inputs.push_back(rollout_inputs[rows[i].item<int64_t>()]);
      auto pick = [&](const at::Tensor& all) {
        if (!all.defined()) return at::Tensor();  // a part this rollout has not
        return all.index_select(0, rows.to(all.device())).to(model->device);
      };
      micro.trajectory.latents = pick(rollout.latents);
      micro.trajectory.next_latents = pick(rollout.next_latents);
      micro.trajectory.log_probs = pick(rollout.log_probs);
      micro.trajectory.prev_sample_means = pick(rollout.prev_sample_means);
      micro.trajectory.timesteps = pick(rollout.timesteps);
      micro.trajectory.final_latents = pick(rollout.final_latents);
      if (behaviour_log_probs.defined()) micro.behaviour_log_probs = pick(behaviour_log_probs);
      if (batch.HasColumn(kRowTrainStepsColumn)) {
        DRAY_ASSIGN_OR_RETURN(at::Tensor steps, batch.GetTensor(kRowTrainStepsColumn));
        if (steps.dim() != 2 || steps.scalar_type() != at::kLong || steps.size(1) < 1)
          return absl::InvalidArgumentError(
              absl::StrCat(kRowTrainStepsColumn, " must be int64 [B, K], K >= 1"));
        micro.train_steps = steps.slice(0, start, end);
      }
      if (batch.HasColumn(kAdvantagesColumn)) {
        DRAY_ASSIGN_OR_RETURN(at::Tensor advantages, batch.GetTensor(kAdvantagesColumn));
        micro.advantages = advantages.slice(0, start, end).to(model->device);
      }
    }
    return out;
  }

  // ForgetRollout drops the last rollout (its rows, encodings, trajectory).
  void ForgetRollout() {
    conditions.Clear();
    rollout_inputs.clear();
    rollout = {};
    behaviour_log_probs = at::Tensor();
    first_update = true;
  }

  // KeepOldPolicy records an adopted rollout's old policy at each row's
  // window step `steps` (the update's first pass computes it) for the
  // passes after.
  void KeepOldPolicy(const MicroBatch& micro, const at::Tensor& steps, const at::Tensor& log_prob,
                     const at::Tensor& prev_sample_mean) {
    const at::Tensor rows = micro.rollout_rows.to(rollout.log_probs.device());
    const at::Tensor at_steps = steps.to(rows.device());
    rollout.log_probs.index_put_({rows, at_steps}, log_prob.to(rollout.log_probs.dtype()));
    rollout.prev_sample_means.index_put_({rows, at_steps},
                                         prev_sample_mean.to(rollout.prev_sample_means.dtype()));
  }

  // BeginUpdate sets the learning rate of the coming optimizer step.
  void BeginUpdate(double lr) {
    for (auto& param_group : optimizer->param_groups())
      static_cast<torch::optim::AdamWOptions&>(param_group.options()).lr(lr);
    optimizer->zero_grad();
  }

  // AgreeFinite: every rank learns whether any rank's loss is not finite
  // before backward (a rank that skipped backward would hang the others);
  // DATA_LOSS naming `where` if so, with no parameter changed (`stepped`:
  // the optimizer of the loss's parameters, the policy's unless given).
  absl::Status AgreeFinite(Communicator* group, const at::Tensor& loss, const std::string& where,
                           torch::optim::Optimizer* stepped = nullptr) {
    at::Tensor bad = at::full({1}, std::isfinite(loss.item<double>()) ? 0.0 : 1.0);
    DRAY_RETURN_IF_ERROR(group->AllReduce(bad, ReduceOp::kMax));
    if (bad.item<double>() == 0) return absl::OkStatus();
    (stepped != nullptr ? stepped : optimizer.get())->zero_grad();
    return absl::DataLossError(
        absl::StrCat("the loss is not finite ", where, "; no parameter was changed"));
  }

  // FinishUpdate clips the accumulated gradients' global norm across ranks
  // and steps the optimizer; returns the norm before clipping.
  absl::StatusOr<double> FinishUpdate() {
    DRAY_ASSIGN_OR_RETURN(double grad_norm, trained().ClipGradNorm(config.max_grad_norm));
    optimizer->step();
    optimizer->zero_grad();
    return grad_norm;
  }

  // Prepare encodes a micro-batch's conditions, reusing those this rank's
  // rollout encoded; with `options`, into `cache` (none: nullptr).
  absl::StatusOr<PreparedRows> Prepare(const MicroBatch& micro) {
    return Prepare(micro, options, &conditions);
  }

  absl::StatusOr<PreparedRows> Prepare(const MicroBatch& micro,
                                       const qwen_image::EditOptions& options,
                                       qwen_image::ConditionCache* cache) {
    return diffusion->Prepare(micro.inputs, options, cache);
  }

  // Dmd2Schedule: the model's `steps`-step schedule for `tokens` latent
  // tokens as DMD2's timesteps t = 0 .. steps-1 (steps-1: pure noise): their
  // sigmas and the transformer's timesteps. The scores' noise levels are
  // its 1000 train timesteps; the generator's steps are its
  // num_denoising_step ones, what `dray edit --steps N` runs.
  struct Dmd2Schedule {
    rl::ScoreParametrization flow;
    at::Tensor timesteps;  // [steps], the transformer's 0..1000 scale

    at::Tensor TimestepsOf(const at::Tensor& t) const {
      return timesteps.index_select(0, t.to(timesteps.device()));
    }
  };
  absl::StatusOr<Dmd2Schedule> Dmd2ScheduleFor(int64_t tokens, int64_t steps) {
    DRAY_ASSIGN_OR_RETURN(qwen_image::FlowMatchEulerScheduler scheduler,
                          diffusion->Scheduler(tokens, static_cast<int>(steps)));
    const at::Tensor sigmas = scheduler.sigmas().narrow(0, 0, steps).flip({0});
    return Dmd2Schedule{rl::ScoreParametrization::Velocity(sigmas.to(model->device)),
                        scheduler.timesteps().flip({0}).to(model->device)};
  }

  // Dmd2Velocity: a score's velocity at train timesteps `t` [B] (no
  // denoiser: the generator's own transformer).
  absl::StatusOr<at::Tensor> Dmd2Velocity(const PreparedRows& prepared,
                                          const Dmd2Schedule& schedule, const at::Tensor& xt,
                                          const at::Tensor& t, double guidance,
                                          const qwen_image::Denoiser& denoiser = nullptr) {
    return diffusion->Velocity(prepared, xt, schedule.TimestepsOf(t), guidance, denoiser);
  }

  // Dmd2Generate: the generator's x0 for a micro-batch, as DMD2's generator
  // turn makes it: `simulated` of its steps in backward simulation from
  // the rows' start noise (without gradients), then one generator pass
  // from its input (differentiable when grad mode is on). `unguided` has
  // no negative prompt.
  absl::StatusOr<at::Tensor> Dmd2Generate(const PreparedRows& unguided, const MicroBatch& micro,
                                          int64_t simulated) {
    DRAY_ASSIGN_OR_RETURN(Dmd2Schedule schedule,
                          Dmd2ScheduleFor(unguided.noise().size(1), config.num_denoising_step));
    std::vector<int64_t> steps;  // noisiest first
    for (int64_t t = config.num_denoising_step - 1; t >= 0; --t) steps.push_back(t);
    absl::Status failed;
    auto x0_at = [&](const at::Tensor& xt, int64_t timestep) -> at::Tensor {
      const at::Tensor t = at::full({xt.size(0)}, timestep, at::kLong);
      absl::StatusOr<at::Tensor> velocity = Dmd2Velocity(unguided, schedule, xt, t, 1.0);
      if (!velocity.ok()) {
        failed.Update(velocity.status());
        return xt;
      }
      return schedule.flow.CleanPrediction(xt, *velocity, t).to(xt.scalar_type());
    };
    const at::IntArrayRef shape = unguided.noise().sizes().slice(1);
    uint64_t draws = 0;
    auto draw = [&](const at::Tensor&) {
      return RowsNoise(micro.inputs, kDmd2Stream + ++draws, shape, model->device);
    };
    const rl::SimulatedInput simulated_input = rl::BackwardSimulated(
        schedule.flow, steps, simulated, RowsNoise(micro.inputs, kDmd2Stream, shape, model->device),
        x0_at, draw);
    DRAY_RETURN_IF_ERROR(failed);
    const at::Tensor input = rl::GeneratorInput(schedule.flow, simulated_input.clean,
                                                unguided.noise(), simulated_input.timestep);
    const at::Tensor x0 = x0_at(input, simulated_input.timestep);
    DRAY_RETURN_IF_ERROR(failed);
    return x0;
  }

  // Dmd2MatchingLoss: the distribution-matching loss of the generator's
  // `x0` (DMD2's compute_distribution_matching_loss): x0 noised at a level
  // in [min_step, max_step], the fake score's and the real score's
  // (guided) x0 there.
  absl::StatusOr<at::Tensor> Dmd2MatchingLoss(const PreparedRows& prepared,
                                              const PreparedRows& unguided, const MicroBatch& micro,
                                              const Dmd2Schedule& schedule, const at::Tensor& x0) {
    const auto percent = [](double share) { return static_cast<int64_t>(share * kTrainTimesteps); };
    const at::Tensor t = RowsTimesteps(
        micro.inputs, kDmd2Stream + kDmd2MatchingLevel, percent(config.min_step_percent),
        std::min<int64_t>(percent(config.max_step_percent) + 1, kTrainTimesteps));
    const at::Tensor noise = RowsNoise(micro.inputs, kDmd2Stream + kDmd2MatchingNoise,
                                       x0.sizes().slice(1), model->device);
    at::Tensor fake_x0, real_x0;
    {
      torch::NoGradGuard no_grad;
      const at::Tensor xt = schedule.flow.Noised(x0.detach(), noise, t);
      DRAY_ASSIGN_OR_RETURN(at::Tensor fake,
                            Dmd2Velocity(unguided, schedule, xt, t, 1.0,
                                         qwen_image::DenoiserOf(*fake_score.transformer)));
      fake_x0 = schedule.flow.CleanPrediction(xt, fake, t);
      DRAY_ASSIGN_OR_RETURN(at::Tensor real, AsReference([&](qwen_image::Denoiser denoiser) {
                              return Dmd2Velocity(prepared, schedule, xt, t,
                                                  config.real_guidance_scale, denoiser);
                            }));
      real_x0 = schedule.flow.CleanPrediction(xt, real, t);
    }
    DRAY_ASSIGN_OR_RETURN(rl::DistributionMatching matching,
                          rl::DistributionMatchingLoss(x0, real_x0, fake_x0));
    return matching.loss * config.dm_loss_weight;
  }

  // Dmd2Logits: the GAN classifier's realism logits [B, 1] for `image`
  // latents (DMD2's compute_cls_logits): the fake score's features after
  // its last block at the clean end of the schedule (train timestep 0) or,
  // with diffusion_gan, noised at a drawn level below
  // diffusion_gan_max_timestep (draws from the rows' seeds + `stream`).
  absl::StatusOr<at::Tensor> Dmd2Logits(const PreparedRows& unguided, const MicroBatch& micro,
                                        const Dmd2Schedule& schedule, const at::Tensor& image,
                                        uint64_t stream) {
    at::Tensor t = at::zeros({image.size(0)}, at::kLong);
    at::Tensor input = image;
    if (config.diffusion_gan) {
      t = RowsTimesteps(micro.inputs, kDmd2Stream + stream, 0, config.diffusion_gan_max_timestep);
      const at::Tensor noise =
          RowsNoise(micro.inputs, kDmd2Stream + stream + 1, image.sizes().slice(1), model->device);
      input = schedule.flow.Noised(image, noise, t);
    }
    at::Tensor features;
    qwen_image::QwenImageTransformerImpl& fake = *fake_score.transformer;
    fake.set_feature_tap(&features);
    const absl::Cleanup untap = [&] { fake.set_feature_tap(nullptr); };
    DRAY_RETURN_IF_ERROR(
        Dmd2Velocity(unguided, schedule, input, t, 1.0, qwen_image::DenoiserOf(fake)).status());
    return classifier->forward(features, input.size(1));
  }

  // Dmd2GeneratorLoss: the generator's loss on its `x0`: distribution
  // matching, and with the GAN the classifier's verdict on x0 (DMD2's
  // gen_cls_loss, through the fake score); each part into `metrics`.
  absl::StatusOr<at::Tensor> Dmd2GeneratorLoss(const PreparedRows& prepared,
                                               const PreparedRows& unguided,
                                               const MicroBatch& micro,
                                               const Dmd2Schedule& schedule, const at::Tensor& x0,
                                               double share, MetaInfo& metrics) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor loss,
                          Dmd2MatchingLoss(prepared, unguided, micro, schedule, x0));
    Accumulate(metrics, "loss_dm", loss.item<double>() * share);
    if (config.cls_on_clean_image && config.gen_cls_loss) {
      DRAY_ASSIGN_OR_RETURN(at::Tensor logits,
                            Dmd2Logits(unguided, micro, schedule, x0, kDmd2GanGenerator));
      const at::Tensor gan = rl::GeneratorGanLoss(logits);
      Accumulate(metrics, "gen_cls_loss", gan.item<double>() * share);
      loss = loss + config.gen_cls_loss_weight * gan;
    }
    return loss * share;
  }

  // Dmd2GuidanceLoss: the fake score's loss on the generator's samples:
  // its denoising loss and, with the GAN, the classifier's on them and on
  // the rows' targets (DMD2's guidance_cls_loss); each part into `metrics`.
  absl::StatusOr<at::Tensor> Dmd2GuidanceLoss(const PreparedRows& unguided, const MicroBatch& micro,
                                              const Dmd2Schedule& schedule, const at::Tensor& x0,
                                              double share, MetaInfo& metrics) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor loss, Dmd2FakeLoss(unguided, micro, schedule, x0));
    Accumulate(metrics, "loss_fake_mean", loss.item<double>() * share);
    if (!config.cls_on_clean_image) return loss * share;
    if (micro.targets.empty())
      return absl::InvalidArgumentError(
          absl::StrCat("cls_on_clean_image needs a ", kTargetsColumn, " column: the real images"));
    DRAY_ASSIGN_OR_RETURN(at::Tensor real, SftTargetLatents(*diffusion, micro.targets, unguided));
    DRAY_ASSIGN_OR_RETURN(at::Tensor real_logits,
                          Dmd2Logits(unguided, micro, schedule, real, kDmd2GanReal));
    DRAY_ASSIGN_OR_RETURN(at::Tensor fake_logits,
                          Dmd2Logits(unguided, micro, schedule, x0, kDmd2GanFake));
    const at::Tensor gan = rl::ClassifierGanLoss(real_logits, fake_logits);
    Accumulate(metrics, "guidance_cls_loss", gan.item<double>() * share);
    Accumulate(metrics, "pred_realism_on_real",
               at::sigmoid(real_logits).mean().item<double>() * share);
    Accumulate(metrics, "pred_realism_on_fake",
               at::sigmoid(fake_logits).mean().item<double>() * share);
    return (loss + config.guidance_cls_loss_weight * gan) * share;
  }

  static void Accumulate(MetaInfo& metrics, const char* key, double value) {
    auto [entry, added] = metrics.emplace(key, 0.0);
    entry->second = std::get<double>(entry->second) + value;
  }

  // Dmd2FakeLoss: the fake score's denoising loss on the generator's
  // samples (DMD2's compute_loss_fake, flow matching's velocity target).
  absl::StatusOr<at::Tensor> Dmd2FakeLoss(const PreparedRows& unguided, const MicroBatch& micro,
                                          const Dmd2Schedule& schedule, const at::Tensor& x0) {
    const at::Tensor t =
        RowsTimesteps(micro.inputs, kDmd2Stream + kDmd2FakeLevel, 0, kTrainTimesteps);
    const at::Tensor noise =
        RowsNoise(micro.inputs, kDmd2Stream + kDmd2FakeNoise, x0.sizes().slice(1), model->device);
    const at::Tensor xt = schedule.flow.Noised(x0, noise, t);
    DRAY_ASSIGN_OR_RETURN(at::Tensor velocity,
                          Dmd2Velocity(unguided, schedule, xt, t, 1.0,
                                       qwen_image::DenoiserOf(*fake_score.transformer)));
    return rl::DenoisingLoss(velocity, schedule.flow.Target(x0, noise));
  }
};

FlowGrpoWorker::FlowGrpoWorker() {
  Def("init_model", &FlowGrpoWorker::InitModel, {kOneToAll});
  MethodOptions batched;  // sharded ranks run in step: every rank gets an equal share
  batched.dispatch_mode = kDpComputeProto;
  batched.collective = true;  // so every rank starts them; rollouts stop together
  Def("rollout", &FlowGrpoWorker::Rollout, batched);
  Def("compute_log_prob", &FlowGrpoWorker::ComputeLogProb, batched);
  Def("edit", &FlowGrpoWorker::Edit, batched);
  MethodOptions per_rank_metrics = batched;  // each rank's metrics come back
  per_rank_metrics.dispatch_mode = kDpComputeMetric;
  Def("update_actor", &FlowGrpoWorker::UpdateActor, per_rank_metrics);
  Def("adopt_rollout", &FlowGrpoWorker::AdoptRollout, per_rank_metrics);
  Def("sft_update", &FlowGrpoWorker::SftUpdate, per_rank_metrics);
  Def("vae_update", &FlowGrpoWorker::VaeUpdate, per_rank_metrics);
  Def("dpo_update", &FlowGrpoWorker::DpoUpdate, per_rank_metrics);
  Def("dmd2_update", &FlowGrpoWorker::Dmd2Update, per_rank_metrics);
  Def("reconstruct", &FlowGrpoWorker::Reconstruct, batched);
  Def("save", &FlowGrpoWorker::Save, {kOneToAll});
  Def("save_checkpoint", &FlowGrpoWorker::SaveCheckpoint, {kOneToAll});
  Def("load_checkpoint", &FlowGrpoWorker::LoadCheckpoint, {kOneToAll});
  Def("timings", &FlowGrpoWorker::Timings, {kOneToAll});
}

absl::StatusOr<DataProto> FlowGrpoWorker::Timings() {
  return DataProto::Make({}, {}, seconds_in_methods_);
}

FlowGrpoWorker::~FlowGrpoWorker() = default;

absl::StatusOr<DataProto> FlowGrpoWorker::InitModel(const DataProto& input) {
  DRAY_ASSIGN_OR_RETURN(std::string yaml, input.GetMeta<std::string>("config"));
  auto state = std::make_unique<State>();
  DRAY_ASSIGN_OR_RETURN(state->config, TrainConfig::FromYaml(yaml));
  const TrainConfig& config = state->config;
  ImageEditConfig model_config = config.model;
  model_config.enable_fsdp = true;  // training always shards (NO_SHARD is DDP)
  DRAY_RETURN_IF_ERROR(config.CheckFamily(model_config.family()));
  auto freeze = [&config](const EditModules& model) -> absl::Status {
    for (const auto& text_encoder : model.text_encoders)
      for (auto& parameter : text_encoder->parameters()) parameter.set_requires_grad(false);
    if (config.vae()) {  // the VAE alone trains
      for (auto& parameter : model.transformer->parameters()) parameter.set_requires_grad(false);
      return absl::OkStatus();
    }
    for (auto& parameter : model.vae->parameters()) parameter.set_requires_grad(false);
    if (config.lora_rank == 0) return absl::OkStatus();
    const LoraOptions lora{config.lora_rank, config.lora_alpha, config.lora_target_modules};
    return AddLoraAdapters(*model.transformer, lora,
                           at::make_generator<at::CPUGeneratorImpl>(config.seed))
        .status();
  };
  DRAY_ASSIGN_OR_RETURN(state->model, LoadEditModel(model_config, *this, freeze));
  state->diffusion.emplace(*state->model);
  state->model->set_activation_checkpointing(config.gradient_checkpointing);
  if (config.vae()) DRAY_RETURN_IF_ERROR(state->ShardVae(*this));
  if (config.frozen_reference()) {
    const ImageEditConfig placed =
        config.dmd2() ? config.ScoreModelConfig(config.real_score) : state->model->config;
    DRAY_ASSIGN_OR_RETURN(state->reference, LoadTransformerCopy(*state->model, *this,
                                                                /*trainable=*/false, placed));
  }
  if (config.dmd2()) {
    AddParts classifier;
    if (config.cls_on_clean_image) {
      classifier = [&state](qwen_image::QwenImageTransformerImpl& fake) {
        return state->AddClassifier(fake);
      };
    }
    DRAY_ASSIGN_OR_RETURN(
        state->fake_score,
        LoadTransformerCopy(*state->model, *this, /*trainable=*/true,
                            config.ScoreModelConfig(config.fake_score), classifier));
    state->fake_optimizer = std::make_unique<torch::optim::AdamW>(
        state->fake_score.shards->shards(),
        torch::optim::AdamWOptions(config.guidance_lr).weight_decay(config.weight_decay));
  }
  state->optimizer = std::make_unique<torch::optim::AdamW>(
      state->trained().shards(),
      torch::optim::AdamWOptions(config.lr).weight_decay(config.weight_decay));
  if (config.sampling_policy()) {  // it starts as the policy
    for (const at::Tensor& shard : state->trained().shards())
      state->sampling_policy.push_back(shard.detach().clone());
  }
  if (config.nft()) {
    DRAY_ASSIGN_OR_RETURN(state->ode_solver, rl::ParseOdeSolver(config.solver));
  }
  DRAY_ASSIGN_OR_RETURN(state->sampler.type, rl::ParseSdeType(config.sde_type));
  state->sampler.noise_level = config.noise_level;
  DRAY_ASSIGN_OR_RETURN(state->loss, rl::FindPolicyLoss(config.policy_loss()));
  // The model's options as serving takes them (sizes, guidance), with the
  // rollout's step count and resolution.
  DRAY_ASSIGN_OR_RETURN(state->options, EditOptionsFor(config.model, {}));
  qwen_image::EditOptions& options = state->options;
  // dmd2: the generator edits in its own few steps, unguided (the
  // negative prompt guides its real score alone).
  options.num_inference_steps =
      static_cast<int>(config.dmd2() ? config.num_denoising_step : config.num_inference_steps);
  if (config.dmd2()) options.negative_prompt.reset();
  if (config.sft()) {
    options.image_size = config.resolution;  // each pair at its own aspect ratio
  } else {
    options.width = options.height = config.resolution;
  }
  // FLUX.1 Kontext renders image_size^2 pixels at the aspect ratio width
  // and height give (its inputs are resized to its preferred resolutions).
  if (state->model->family == ModelFamily::kFluxKontext) options.image_size = config.resolution;
  state_ = std::move(state);
  return DataProto::Make({}, {}, state_->model->MemoryFigures(rank()));
}

absl::StatusOr<DataProto> FlowGrpoWorker::Rollout(const DataProto& batch) {
  const SecondsIn timed(seconds_in_methods_, "rollout");
  if (state_ == nullptr) return absl::FailedPreconditionError("call init_model before rollout");
  DRAY_ASSIGN_OR_RETURN(int64_t begin, batch.GetMeta<int64_t>(kSdeWindowBeginKey));
  DRAY_ASSIGN_OR_RETURN(int64_t end, batch.GetMeta<int64_t>(kSdeWindowEndKey));
  rl::SdeSamplerOptions sampler = state_->sampler;
  sampler.window = {static_cast<int>(begin), static_cast<int>(end)};
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->MicroBatches(batch));
  state_->ForgetRollout();
  state_->RefreshWhenAsked(batch);
  const int64_t steps = state_->options.num_inference_steps;
  const int64_t total = steps * static_cast<int64_t>(micro_batches.size());
  std::vector<rl::Trajectory> trajectories;
  std::vector<Image> images;
  int64_t done_before = 0;
  torch::NoGradGuard no_grad;
  for (const MicroBatch& micro : micro_batches) {
    DRAY_ASSIGN_OR_RETURN(PreparedRows prepared, state_->Prepare(micro));
    DRAY_ASSIGN_OR_RETURN(rl::SdeSchedule schedule, state_->Schedule(prepared.noise().size(1)));
    std::vector<at::Generator> generators;
    for (size_t i = 0; i < micro.inputs.size(); ++i) {
      const uint64_t own = micro.sde_seeds.empty() ? micro.inputs[i].seed : micro.sde_seeds[i];
      generators.push_back(at::make_generator<at::CPUGeneratorImpl>(own + kSdeNoiseStream));
    }
    auto draw = [&](int) {
      std::vector<at::Tensor> noise;
      for (at::Generator& generator : generators) {
        noise.push_back(at::randn({1, prepared.noise().size(1), prepared.noise().size(2)},
                                  generator, at::kFloat));
      }
      return at::cat(noise).to(prepared.noise().device());
    };
    auto on_step = [&](int step, int) -> absl::Status {
      ReportProgress("denoising", done_before + step, total);
      return StopRequestedOnAnyRank();
    };
    DRAY_ASSIGN_OR_RETURN(rl::Trajectory trajectory,
                          state_->Sample(schedule, prepared, draw, sampler, on_step));
    done_before += steps;
    DRAY_ASSIGN_OR_RETURN(
        std::vector<at::Tensor> decoded,
        state_->diffusion->Decode(trajectory.final_latents, prepared.height(), prepared.width()));
    for (const at::Tensor& image : decoded) images.push_back(RawImage(image));
    trajectories.push_back(std::move(trajectory));
  }
  auto joined = [&](at::Tensor rl::Trajectory::*part) {
    std::vector<at::Tensor> parts;
    for (const rl::Trajectory& trajectory : trajectories) parts.push_back(trajectory.*part);
    return at::cat(parts);
  };
  rl::Trajectory& kept = state_->rollout;
  kept.latents = joined(&rl::Trajectory::latents);
  kept.next_latents = joined(&rl::Trajectory::next_latents);
  kept.log_probs = joined(&rl::Trajectory::log_probs);
  kept.prev_sample_means = joined(&rl::Trajectory::prev_sample_means);
  kept.timesteps = joined(&rl::Trajectory::timesteps);
  kept.final_latents = joined(&rl::Trajectory::final_latents);
  for (MicroBatch& micro : micro_batches) {
    for (qwen_image::EditInput& input : micro.inputs)
      state_->rollout_inputs.push_back(std::move(input));
  }
  DRAY_ASSIGN_OR_RETURN(DataProto out, DataProto::Make({}, {{kEditedColumn, std::move(images)}}));
  if (batch.GetMeta<bool>(kReturnTrajectoryKey).value_or(false)) {
    DRAY_RETURN_IF_ERROR(out.AddTensor(kLatentsColumn, kept.latents.cpu()));
    DRAY_RETURN_IF_ERROR(out.AddTensor(kNextLatentsColumn, kept.next_latents.cpu()));
    DRAY_RETURN_IF_ERROR(out.AddTensor(kLogProbsColumn, kept.log_probs.cpu()));
    DRAY_RETURN_IF_ERROR(out.AddTensor(kTimestepsColumn, kept.timesteps.cpu()));
  }
  return out;
}

absl::StatusOr<DataProto> FlowGrpoWorker::Edit(const DataProto& batch) {
  if (state_ == nullptr) return absl::FailedPreconditionError("call init_model before edit");
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->MicroBatches(batch));
  torch::NoGradGuard no_grad;
  std::vector<Image> images;
  for (const MicroBatch& micro : micro_batches) {
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> edited,
                          state_->diffusion->Edit(micro.inputs, state_->options));
    for (const at::Tensor& image : edited) images.push_back(RawImage(image));
  }
  return DataProto::Make({}, {{kEditedColumn, std::move(images)}});
}

absl::StatusOr<DataProto> FlowGrpoWorker::ComputeLogProb(const DataProto& batch) {
  if (state_ == nullptr)
    return absl::FailedPreconditionError("call init_model before compute_log_prob");
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->KeptMicroBatches(batch));
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> log_probs;
  for (const MicroBatch& micro : micro_batches) {
    DRAY_ASSIGN_OR_RETURN(PreparedRows prepared, state_->Prepare(micro));
    DRAY_ASSIGN_OR_RETURN(rl::SdeSchedule schedule, state_->Schedule(prepared.noise().size(1)));
    std::vector<at::Tensor> steps;
    for (int64_t j = 0; j < micro.trajectory.timesteps.size(1); ++j) {
      DRAY_ASSIGN_OR_RETURN(rl::SdeStepResult step,
                            rl::RecomputeStep(schedule, state_->Predictor(prepared),
                                              micro.trajectory, j, state_->sampler));
      steps.push_back(step.log_prob.cpu());
    }
    log_probs.push_back(steps.empty() ? at::empty({micro.trajectory.timesteps.size(0), 0})
                                      : at::stack(steps, 1));  // an empty window keeps none
  }
  return DataProto::Make({{kLogProbsColumn, at::cat(log_probs)}});
}

absl::StatusOr<DataProto> FlowGrpoWorker::AdoptRollout(const DataProto& batch) {
  const SecondsIn timed(seconds_in_methods_, "adopt_rollout");
  if (state_ == nullptr)
    return absl::FailedPreconditionError("call init_model before adopt_rollout");
  DRAY_ASSIGN_OR_RETURN(std::vector<EditRow> rows, DecodeEditRows(batch, state_->config.seed));
  const int64_t count = static_cast<int64_t>(rows.size());
  rl::Trajectory adopted;
  for (const auto& [column, part] : {std::pair{kLatentsColumn, &rl::Trajectory::latents},
                                     std::pair{kNextLatentsColumn, &rl::Trajectory::next_latents},
                                     std::pair{kLogProbsColumn, &rl::Trajectory::log_probs},
                                     std::pair{kTimestepsColumn, &rl::Trajectory::timesteps}}) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor tensor, batch.GetTensor(column));
    adopted.*part = tensor.to(state_->model->device);
  }
  const at::Tensor& log_probs = adopted.log_probs;
  if (log_probs.dim() != 2 || log_probs.size(0) != count ||
      adopted.timesteps.sizes() != log_probs.sizes() ||
      adopted.latents.sizes() != adopted.next_latents.sizes() || adopted.latents.dim() < 3 ||
      adopted.latents.size(0) != count || adopted.latents.size(1) != log_probs.size(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adopt_rollout needs ", kLogProbsColumn, " and ", kTimestepsColumn, " [B, T] and ",
        kLatentsColumn, " and ", kNextLatentsColumn, " [B, T, ...] for its ", count, " rows"));
  }
  state_->ForgetRollout();
  for (EditRow& row : rows)
    state_->rollout_inputs.push_back({row.images, row.instruction, row.seed});
  state_->rollout = adopted;
  // The update's old policy, this one before its first step on the rollout,
  // fills these in at the steps it trains (update_actor).
  state_->rollout.log_probs = log_probs.clone();
  state_->rollout.prev_sample_means = at::zeros_like(adopted.latents);
  state_->behaviour_log_probs = log_probs;
  return DataProto::Make({});
}

absl::StatusOr<DataProto> FlowGrpoWorker::UpdateActor(const DataProto& batch) {
  const SecondsIn timed(seconds_in_methods_, "update_actor");
  if (state_ == nullptr)
    return absl::FailedPreconditionError("call init_model before update_actor");
  const TrainConfig& config = state_->config;
  if (config.nft()) return NftUpdate(batch);
  DRAY_ASSIGN_OR_RETURN(Json steps_json, batch.GetMeta<Json>(kTrainStepsKey));
  DRAY_ASSIGN_OR_RETURN(double lr, batch.GetMeta<double>(kLearningRateKey));
  const std::vector<int64_t> train_steps =
      nlohmann::json::parse(steps_json.text, nullptr, false).get<std::vector<int64_t>>();
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->KeptMicroBatches(batch));
  DRAY_ASSIGN_OR_RETURN(Communicator * group, comm());
  state_->BeginUpdate(lr);

  const int64_t accumulation = static_cast<int64_t>(micro_batches.size() * train_steps.size());
  const rl::PolicyLossOptions loss_options{config.clip_range, config.adv_clip_max, config.beta,
                                           accumulation, config.kl_coeff};
  std::map<std::string, double> sums;
  double gap_max = 0;
  for (const MicroBatch& micro : micro_batches) {
    DRAY_ASSIGN_OR_RETURN(PreparedRows prepared, state_->Prepare(micro));
    DRAY_ASSIGN_OR_RETURN(rl::SdeSchedule schedule, state_->Schedule(prepared.noise().size(1)));
    const int64_t rows = static_cast<int64_t>(micro.inputs.size());
    for (size_t k = 0; k < train_steps.size(); ++k) {
      // The rows' window steps: the step's shared k-th, or each row's own.
      const at::Tensor j = micro.train_steps.defined()
                               ? micro.train_steps.select(1, static_cast<int64_t>(k))
                               : at::full({rows}, train_steps[k], at::kLong);
      rl::PolicyLossInput input;
      if (config.beta > 0) {
        DRAY_ASSIGN_OR_RETURN(rl::SdeStepResult reference,
                              state_->ReferenceStep(schedule, prepared, micro, j));
        input.prev_sample_mean_ref = reference.prev_sample_mean;
      }
      DRAY_ASSIGN_OR_RETURN(rl::SdeStepResult policy,
                            rl::RecomputeStep(schedule, state_->Predictor(prepared),
                                              micro.trajectory, j, state_->sampler));
      input.advantages = micro.advantages;
      input.log_prob = policy.log_prob;
      input.old_log_prob = rl::AtSteps(micro.trajectory.log_probs, j);
      input.prev_sample_mean = policy.prev_sample_mean;
      input.std_dev_t = policy.std_dev_t;
      input.old_prev_sample_mean = rl::AtSteps(micro.trajectory.prev_sample_means, j);
      input.sqrt_neg_dt = policy.sqrt_neg_dt;
      // An adopted rollout was sampled by an older (behaviour) policy: this
      // one, before its first step on it, is the update's old policy.
      const bool adopted = micro.behaviour_log_probs.defined();
      const at::Tensor sampled =
          adopted ? rl::AtSteps(micro.behaviour_log_probs, j) : input.old_log_prob;
      if (adopted && state_->first_update) {
        input.old_log_prob = policy.log_prob.detach();
        input.old_prev_sample_mean = policy.prev_sample_mean.detach();
        state_->KeepOldPolicy(micro, j, input.old_log_prob, input.old_prev_sample_mean);
      }
      if (state_->first_update) {  // the log-prob gap between sampling and training
        const at::Tensor gap = (policy.log_prob.detach() - sampled).abs();
        gap_max = std::max(gap_max, gap.max().item<double>());
        sums["logprob_gap_mean"] += gap.mean().item<double>();
      }
      if (adopted) {
        const at::Tensor ratio = at::exp(input.old_log_prob - sampled);
        input.is_weight = at::clamp_max(ratio, config.rollout_is_threshold);
        sums["rollout_is_mean"] += ratio.mean().item<double>();
        sums["rollout_is_clipfrac"] +=
            (ratio > config.rollout_is_threshold).to(at::kFloat).mean().item<double>();
      }
      DRAY_ASSIGN_OR_RETURN(rl::PolicyLossOutput out, state_->loss(input, loss_options));
      DRAY_RETURN_IF_ERROR(state_->AgreeFinite(
          group, out.loss,
          micro.train_steps.defined() ? absl::StrCat("at the rows' trained step ", k)
                                      : absl::StrCat("at window step ", train_steps[k])));
      out.loss.backward();
      const double g = static_cast<double>(accumulation);
      sums["loss"] += out.loss.item<double>();
      sums["policy_loss"] += out.policy_loss.item<double>();
      if (out.kl_loss.defined()) sums["kl"] += out.kl_loss.item<double>() * g;
      sums["log_prob_kl"] += out.log_prob_kl_loss.item<double>() * g;
      sums["approx_kl"] += out.approx_kl.item<double>();
      sums["clipfrac"] += out.clipfrac.item<double>();
      sums["ratio_mean"] += out.ratio.mean().item<double>();
    }
  }
  DRAY_ASSIGN_OR_RETURN(double grad_norm, state_->FinishUpdate());
  const double n = static_cast<double>(accumulation);
  MetaInfo metrics = {{"loss", sums["loss"]},  // the accumulated objective of this rank
                      {"policy_loss", sums["policy_loss"]},
                      {"kl", sums["kl"] / n},
                      {"log_prob_kl", sums["log_prob_kl"] / n},
                      {"approx_kl", sums["approx_kl"] / n},
                      {"clipfrac", sums["clipfrac"] / n},
                      {"ratio_mean", sums["ratio_mean"] / n},
                      {"grad_norm", grad_norm}};
  if (state_->behaviour_log_probs.defined()) {
    metrics["rollout_is_mean"] = sums["rollout_is_mean"] / n;
    metrics["rollout_is_clipfrac"] = sums["rollout_is_clipfrac"] / n;
  }
  if (state_->first_update) {
    metrics["logprob_gap_max"] = gap_max;
    metrics["logprob_gap_mean"] = sums["logprob_gap_mean"] / n;
  }
  state_->first_update = false;
  return DataProto::Make({}, {}, std::move(metrics));
}

absl::StatusOr<DataProto> FlowGrpoWorker::NftUpdate(const DataProto& batch) {
  const TrainConfig& config = state_->config;
  DRAY_ASSIGN_OR_RETURN(double lr, batch.GetMeta<double>(kLearningRateKey));
  DRAY_ASSIGN_OR_RETURN(int64_t epoch, batch.GetMeta<int64_t>(kInnerEpochKey));
  if (!batch.HasColumn(kRowTrainStepsColumn) || !batch.HasColumn(kAdvantagesColumn))
    return absl::InvalidArgumentError(absl::StrCat("update_actor with diffusion_nft needs the ",
                                                   kAdvantagesColumn, " and ", kRowTrainStepsColumn,
                                                   " columns"));
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->KeptMicroBatches(batch));
  DRAY_ASSIGN_OR_RETURN(Communicator * group, comm());
  state_->BeginUpdate(lr);
  const int64_t trained = micro_batches.empty() ? 0 : micro_batches.front().train_steps.size(1);
  const rl::NftLossOptions options{config.nft_beta, config.beta, config.adv_clip_max,
                                   config.adv_mode,
                                   static_cast<int64_t>(micro_batches.size()) * trained};
  std::map<std::string, double> sums;
  for (const MicroBatch& micro : micro_batches) {
    DRAY_ASSIGN_OR_RETURN(PreparedRows prepared, state_->Prepare(micro));
    DRAY_ASSIGN_OR_RETURN(rl::SdeSchedule schedule, state_->Schedule(prepared.noise().size(1)));
    const int64_t steps = schedule.timesteps.size(0);
    const at::Tensor& x0 = micro.trajectory.final_latents;
    if (!x0.defined())
      return absl::FailedPreconditionError(
          "update_actor with diffusion_nft needs this rank's own rollout (its clean latents)");
    sums["x0_norm"] += x0.pow(2).mean().item<double>() * static_cast<double>(trained);
    for (int64_t k = 0; k < trained; ++k) {
      // Each row at its own k-th trained timestep, noised afresh.
      const at::Tensor rows_steps = micro.train_steps.select(1, k);
      if (rows_steps.min().item<int64_t>() < 0 || rows_steps.max().item<int64_t>() >= steps)
        return absl::InvalidArgumentError(absl::StrCat(
            kRowTrainStepsColumn, " must name steps of the ", steps, "-step schedule"));
      const at::Tensor timestep =
          schedule.timesteps.index_select(0, rows_steps.to(schedule.timesteps.device()));
      rl::NftLossInput input;
      input.x0 = x0;
      input.noise = RowsNoise(micro.inputs, kNftNoiseStream + (epoch << 20) + k,
                              x0.sizes().slice(1), x0.device());
      input.t = timestep.to(x0.device()) / 1000.0;
      input.advantages = micro.advantages;
      const at::Tensor xt = rl::NftNoised(x0, input.noise, input.t);
      auto velocity_of = [&](qwen_image::Denoiser denoiser) -> absl::StatusOr<at::Tensor> {
        DRAY_ASSIGN_OR_RETURN(at::Tensor v, state_->Predictor(prepared, denoiser)(xt, timestep));
        return AtLeastFloat32(v);
      };
      DRAY_ASSIGN_OR_RETURN(input.old_velocity,
                            state_->WithSamplingPolicy([&] { return velocity_of(nullptr); }));
      if (config.beta > 0) {
        DRAY_ASSIGN_OR_RETURN(input.ref_velocity, state_->AsReference(velocity_of));
      }
      DRAY_ASSIGN_OR_RETURN(input.velocity, velocity_of(nullptr));
      DRAY_ASSIGN_OR_RETURN(rl::NftLossOutput out, rl::NftLoss(input, options));
      DRAY_RETURN_IF_ERROR(state_->AgreeFinite(
          group, out.loss, absl::StrCat("in DiffusionNFT's loss at the rows' trained step ", k)));
      out.loss.backward();
      torch::NoGradGuard no_grad;
      sums["loss"] += out.loss.item<double>();
      sums["policy_loss"] += out.policy_loss.item<double>();
      sums["kl_div"] += out.kl_loss.item<double>();
      sums["old_deviate"] += (input.velocity - input.old_velocity).pow(2).mean().item<double>();
    }
  }
  DRAY_ASSIGN_OR_RETURN(double grad_norm, state_->FinishUpdate());
  if (batch.meta_info().count(kSamplingPolicyDecayKey) > 0) {
    DRAY_ASSIGN_OR_RETURN(double decay, batch.GetMeta<double>(kSamplingPolicyDecayKey));
    state_->BlendSamplingPolicy(decay);
  }
  const double n = static_cast<double>(std::max<int64_t>(1, options.accumulation_steps));
  MetaInfo metrics = {{"loss", sums["loss"]}, {"grad_norm", grad_norm}};
  for (const char* key : {"policy_loss", "kl_div", "old_deviate", "x0_norm"})
    metrics[key] = sums[key] / n;
  return DataProto::Make({}, {}, std::move(metrics));
}

absl::StatusOr<DataProto> FlowGrpoWorker::SftUpdate(const DataProto& batch) {
  const SecondsIn timed(seconds_in_methods_, "sft_update");
  if (state_ == nullptr) return absl::FailedPreconditionError("call init_model before sft_update");
  DRAY_ASSIGN_OR_RETURN(double lr, batch.GetMeta<double>(kLearningRateKey));
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->MicroBatches(batch));
  DRAY_ASSIGN_OR_RETURN(Communicator * group, comm());
  state_->BeginUpdate(lr);
  qwen_image::EditOptions conditional = state_->options;  // one forward: no guidance
  conditional.negative_prompt.reset();
  double loss_sum = 0;
  for (const MicroBatch& micro : micro_batches) {
    if (micro.targets.empty())
      return absl::InvalidArgumentError(absl::StrCat("sft_update needs a ", kTargetsColumn,
                                                     " and a ", kSigmaDrawsColumn, " column"));
    DRAY_ASSIGN_OR_RETURN(PreparedRows prepared,
                          state_->Prepare(micro, conditional, /*cache=*/nullptr));
    DRAY_ASSIGN_OR_RETURN(at::Tensor target_latents,
                          SftTargetLatents(*state_->diffusion, micro.targets, prepared));
    DRAY_ASSIGN_OR_RETURN(qwen_image::FlowMatchEulerScheduler schedule,
                          state_->diffusion->Scheduler(prepared.noise().size(1), kTrainTimesteps));
    const SftNoising noising =
        SftNoise(schedule, micro.sigma_draws, target_latents, prepared.noise());
    DRAY_ASSIGN_OR_RETURN(at::Tensor velocity,
                          state_->diffusion->Velocity(prepared, noising.noisy, noising.timesteps,
                                                      /*true_cfg_scale=*/1.0));
    const at::Tensor loss = at::mse_loss(AtLeastFloat32(velocity), noising.target) /
                            static_cast<double>(micro_batches.size());
    DRAY_RETURN_IF_ERROR(state_->AgreeFinite(group, loss, "in the flow-matching loss"));
    loss.backward();
    loss_sum += loss.item<double>();
  }
  DRAY_ASSIGN_OR_RETURN(double grad_norm, state_->FinishUpdate());
  return DataProto::Make({}, {}, {{"loss", loss_sum}, {"grad_norm", grad_norm}});
}

absl::StatusOr<DataProto> FlowGrpoWorker::DpoUpdate(const DataProto& batch) {
  const SecondsIn timed(seconds_in_methods_, "dpo_update");
  if (state_ == nullptr) return absl::FailedPreconditionError("call init_model before dpo_update");
  state_->RefreshWhenAsked(batch);
  DRAY_ASSIGN_OR_RETURN(double lr, batch.GetMeta<double>(kLearningRateKey));
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->MicroBatches(batch));
  if (micro_batches.empty()) return absl::InvalidArgumentError("dpo_update needs at least one row");
  for (const MicroBatch& micro : micro_batches) {
    if (micro.targets.empty() || micro.rejected.empty() || !micro.sigma_draws.defined() ||
        micro.sigma_draws.dim() != 2)
      return absl::InvalidArgumentError(absl::StrCat("dpo_update needs ", kTargetsColumn, ", ",
                                                     kRejectedColumn, " and a [B, draws] ",
                                                     kSigmaDrawsColumn, " column"));
  }
  DRAY_ASSIGN_OR_RETURN(Communicator * group, comm());
  state_->BeginUpdate(lr);
  qwen_image::EditOptions conditional = state_->options;  // no guidance, as SFT
  conditional.negative_prompt.reset();
  EditDiffusion& diffusion = *state_->diffusion;
  const int64_t draws = micro_batches.front().sigma_draws.size(1);
  const int64_t accumulation = static_cast<int64_t>(micro_batches.size()) * draws;
  std::map<std::string, double> sums;
  for (const MicroBatch& micro : micro_batches) {
    DRAY_ASSIGN_OR_RETURN(PreparedRows prepared,
                          state_->Prepare(micro, conditional, /*cache=*/nullptr));
    DRAY_ASSIGN_OR_RETURN(at::Tensor chosen, SftTargetLatents(diffusion, micro.targets, prepared));
    DRAY_ASSIGN_OR_RETURN(at::Tensor rejected,
                          SftTargetLatents(diffusion, micro.rejected, prepared));
    DRAY_ASSIGN_OR_RETURN(qwen_image::FlowMatchEulerScheduler schedule,
                          diffusion.Scheduler(prepared.noise().size(1), kTrainTimesteps));
    for (int64_t d = 0; d < draws; ++d) {
      // A pair's chosen and rejected edits share the draw's noise and timestep.
      const at::Tensor pair_noise =
          RowsNoise(micro.inputs, kDpoNoiseStream + d, chosen.sizes().slice(1), chosen.device());
      const at::Tensor u = micro.sigma_draws.select(1, d);
      const SftNoising w = SftNoise(schedule, u, chosen, pair_noise);
      const SftNoising l = SftNoise(schedule, u, rejected, pair_noise);
      auto velocities = [&](qwen_image::Denoiser denoiser) -> absl::StatusOr<at::Tensor> {
        DRAY_ASSIGN_OR_RETURN(at::Tensor on_w,
                              diffusion.Velocity(prepared, w.noisy, w.timesteps, 1.0, denoiser));
        DRAY_ASSIGN_OR_RETURN(at::Tensor on_l,
                              diffusion.Velocity(prepared, l.noisy, l.timesteps, 1.0, denoiser));
        return at::cat({on_w, on_l});
      };
      DRAY_ASSIGN_OR_RETURN(at::Tensor prediction, velocities(nullptr));
      DRAY_ASSIGN_OR_RETURN(at::Tensor reference, state_->AsReference(velocities));
      DRAY_ASSIGN_OR_RETURN(rl::DpoLossOutput out,
                            rl::DpoLoss({prediction, reference, at::cat({w.target, l.target})},
                                        {state_->config.beta, accumulation}));
      DRAY_RETURN_IF_ERROR(state_->AgreeFinite(group, out.loss, "in the DPO loss"));
      out.loss.backward();
      sums["loss"] += out.unscaled_loss.item<double>();
      sums["implicit_acc"] += out.implicit_acc.item<double>();
      sums["dpo_margin"] += out.inside.mean().item<double>();
    }
  }
  DRAY_ASSIGN_OR_RETURN(double grad_norm, state_->FinishUpdate());
  MetaInfo metrics = {{"grad_norm", grad_norm}};
  for (const auto& [key, sum] : sums) metrics[key] = sum / static_cast<double>(accumulation);
  return DataProto::Make({}, {}, std::move(metrics));
}

absl::StatusOr<DataProto> FlowGrpoWorker::Dmd2Update(const DataProto& batch) {
  const SecondsIn timed(seconds_in_methods_, "dmd2_update");
  if (state_ == nullptr || !state_->config.dmd2())
    return absl::FailedPreconditionError(
        "call init_model with algorithm.name dmd2 before dmd2_update");
  State& state = *state_;
  DRAY_ASSIGN_OR_RETURN(double lr, batch.GetMeta<double>(kLearningRateKey));
  DRAY_ASSIGN_OR_RETURN(double fake_lr, batch.GetMeta<double>(kGuidanceLearningRateKey));
  DRAY_ASSIGN_OR_RETURN(int64_t simulated, batch.GetMeta<int64_t>(kSimulatedStepsKey));
  DRAY_ASSIGN_OR_RETURN(bool update_generator, batch.GetMeta<bool>(kUpdateGeneratorKey));
  if (simulated < 0 || simulated >= state.config.num_denoising_step) {
    return absl::InvalidArgumentError(absl::StrCat(kSimulatedStepsKey, " ", simulated,
                                                   " is not in 0 .. num_denoising_step - 1 (",
                                                   state.config.num_denoising_step - 1, ")"));
  }
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state.MicroBatches(batch));
  DRAY_ASSIGN_OR_RETURN(Communicator * group, comm());
  const double share = 1.0 / static_cast<double>(micro_batches.size());
  MetaInfo metrics;
  // The generator's turn: its samples (DMD2 hands the same ones, detached,
  // to the fake score's turn), and with update_generator its step on its
  // loss (distribution matching, and the GAN's).
  std::vector<at::Tensor> samples;
  std::vector<PreparedRows> unguided_edits;
  std::vector<State::Dmd2Schedule> schedules;  // the scores' noise levels, per micro-batch
  if (update_generator) state.BeginUpdate(lr);
  for (const MicroBatch& micro : micro_batches) {
    qwen_image::EditOptions options = state.options;  // unguided
    if (state.config.real_guidance_scale > 1) {       // the real score's guidance alone decides
      options.negative_prompt = state.config.model.negative_prompt;
      options.true_cfg_scale = state.config.real_guidance_scale;
    }
    DRAY_ASSIGN_OR_RETURN(PreparedRows prepared, state.Prepare(micro, options, /*cache=*/nullptr));
    PreparedRows& unguided = unguided_edits.emplace_back(prepared);
    unguided.DropGuidance();
    DRAY_ASSIGN_OR_RETURN(State::Dmd2Schedule scheduled,
                          state.Dmd2ScheduleFor(prepared.noise().size(1), kTrainTimesteps));
    const State::Dmd2Schedule& schedule = schedules.emplace_back(std::move(scheduled));
    std::optional<torch::NoGradGuard> frozen;
    if (!update_generator) frozen.emplace();
    DRAY_ASSIGN_OR_RETURN(at::Tensor x0, state.Dmd2Generate(unguided, micro, simulated));
    samples.push_back(x0.detach());
    ReportProgress("distilling", static_cast<int64_t>(samples.size()),
                   static_cast<int64_t>(micro_batches.size()));
    if (!update_generator) continue;
    DRAY_ASSIGN_OR_RETURN(at::Tensor loss, state.Dmd2GeneratorLoss(prepared, unguided, micro,
                                                                   schedule, x0, share, metrics));
    DRAY_RETURN_IF_ERROR(state.AgreeFinite(group, loss, "in the generator's loss"));
    loss.backward();
  }
  if (update_generator) {
    DRAY_ASSIGN_OR_RETURN(double grad_norm, state.FinishUpdate());
    metrics["grad_norm"] = grad_norm;
  }
  // The fake score's turn.
  torch::optim::AdamW& fake_optimizer = *state.fake_optimizer;
  for (auto& param_group : fake_optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(param_group.options()).lr(fake_lr);
  fake_optimizer.zero_grad();  // also what the generator's GAN loss left there
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(at::Tensor loss,
                          state.Dmd2GuidanceLoss(unguided_edits[i], micro_batches[i], schedules[i],
                                                 samples[i], share, metrics));
    DRAY_RETURN_IF_ERROR(
        state.AgreeFinite(group, loss, "in the fake score's loss", &fake_optimizer));
    loss.backward();
  }
  DRAY_ASSIGN_OR_RETURN(double fake_grad_norm,
                        state.fake_score.shards->ClipGradNorm(state.config.max_grad_norm));
  fake_optimizer.step();
  fake_optimizer.zero_grad();
  metrics["fake_grad_norm"] = fake_grad_norm;
  return DataProto::Make({}, {}, metrics);
}

absl::StatusOr<DataProto> FlowGrpoWorker::VaeUpdate(const DataProto& batch) {
  const SecondsIn timed(seconds_in_methods_, "vae_update");
  if (state_ == nullptr || !state_->vae_shards)
    return absl::FailedPreconditionError("vae_update needs init_model with algorithm.name vae");
  DRAY_ASSIGN_OR_RETURN(double lr, batch.GetMeta<double>(kLearningRateKey));
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->MicroBatches(batch));
  DRAY_ASSIGN_OR_RETURN(Communicator * group, comm());
  state_->BeginUpdate(lr);
  const double parts = static_cast<double>(micro_batches.size());
  std::map<std::string, double> sums;
  for (const MicroBatch& micro : micro_batches) {
    std::vector<at::Tensor> images;  // each row's input, then its target (if any)
    std::vector<int64_t> seeds;
    for (size_t i = 0; i < micro.inputs.size(); ++i) {
      images.push_back(micro.inputs[i].images[0]);
      seeds.push_back(micro.inputs[i].seed);
      if (micro.targets.empty()) continue;
      images.push_back(micro.targets[i]);
      seeds.push_back(micro.inputs[i].seed + kSdeNoiseStream);
    }
    DRAY_ASSIGN_OR_RETURN(VaeLoss out, state_->VaeLossOf(images, seeds));
    const at::Tensor loss = out.loss / parts;
    DRAY_RETURN_IF_ERROR(state_->AgreeFinite(group, loss, "in the VAE's loss"));
    loss.backward();
    sums["loss"] += loss.item<double>();
    sums["reconstruction_mse"] += out.reconstruction_mse.item<double>() / parts;
    sums["kl"] += out.kl.item<double>() / parts;
    sums["latent_std"] += out.latents.std().item<double>() / parts;
  }
  DRAY_ASSIGN_OR_RETURN(double grad_norm, state_->FinishUpdate());
  return DataProto::Make(
      {}, {},
      {{"loss", sums["loss"]},
       {"reconstruction_rmse", ReconstructionRmse255(sums["reconstruction_mse"])},
       {"kl", sums["kl"]},
       {"latent_std", sums["latent_std"]},
       {"grad_norm", grad_norm}});
}

absl::StatusOr<DataProto> FlowGrpoWorker::Reconstruct(const DataProto& batch) {
  if (state_ == nullptr || !state_->vae_shards)
    return absl::FailedPreconditionError("reconstruct needs init_model with algorithm.name vae");
  DRAY_ASSIGN_OR_RETURN(std::vector<MicroBatch> micro_batches, state_->MicroBatches(batch));
  torch::NoGradGuard no_grad;
  std::vector<Image> images;
  for (const MicroBatch& micro : micro_batches) {
    std::vector<at::Tensor> inputs;
    for (const qwen_image::EditInput& input : micro.inputs) inputs.push_back(input.images[0]);
    DRAY_ASSIGN_OR_RETURN(VaeLoss out, state_->VaeLossOf(inputs, /*seeds=*/{}));
    DRAY_ASSIGN_OR_RETURN(std::vector<at::Tensor> reconstructions,
                          PixelsToImages(out.reconstructions));
    for (const at::Tensor& image : reconstructions) images.push_back(RawImage(image));
  }
  return DataProto::Make({}, {{kEditedColumn, std::move(images)}});
}

absl::StatusOr<DataProto> FlowGrpoWorker::Save(const DataProto& input) {
  if (state_ == nullptr) return absl::FailedPreconditionError("call init_model before save");
  DRAY_ASSIGN_OR_RETURN(std::string dir, input.GetMeta<std::string>(kDirKey));
  const TrainConfig& config = state_->config;
  DRAY_ASSIGN_OR_RETURN(auto parameters, state_->trained().FullParameters());
  const std::string component = config.vae() ? "vae" : "transformer";
  // Rank 0 writes; every rank meets at the barrier, also when writing failed.
  auto write = [&]() -> absl::Status {
    std::error_code error;
    const bool lora = config.lora_rank > 0 && !config.vae();
    std::filesystem::create_directories(lora ? dir : dir + "/" + component, error);
    if (error) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", dir, ": ", error.message()));
    }
    if (!lora) {
      return WriteSafetensors(dir + "/" + component + "/diffusion_pytorch_model.safetensors",
                              parameters, {{"format", "pt"}});
    }
    std::vector<std::pair<std::string, at::Tensor>> kept;
    for (auto& [name, tensor] : parameters) {
      if (name.find(".lora_") != std::string::npos)
        kept.emplace_back(absl::StrCat("transformer.", name), tensor);
    }
    return WriteSafetensors(
        absl::StrCat(dir, "/", kLoraFile), kept,
        {{"format", "pt"},
         {"lora_rank", std::to_string(config.lora_rank)},
         {"lora_alpha", absl::StrCat(config.lora_alpha)},
         {"target_modules", nlohmann::json(config.lora_target_modules).dump()}});
  };
  const absl::Status written = rank() == 0 ? write() : absl::OkStatus();
  DRAY_ASSIGN_OR_RETURN(Communicator * group, comm());
  DRAY_RETURN_IF_ERROR(group->Barrier());  // written when any rank returns
  DRAY_RETURN_IF_ERROR(written);
  return DataProto::Make({});
}

absl::StatusOr<DataProto> FlowGrpoWorker::SaveCheckpoint(const DataProto& input) {
  if (state_ == nullptr)
    return absl::FailedPreconditionError("call init_model before save_checkpoint");
  DRAY_ASSIGN_OR_RETURN(std::string dir, input.GetMeta<std::string>(kDirKey));
  FullyShardedModule& sharded = state_->trained();
  DRAY_RETURN_IF_ERROR(sharded.SaveShardedLike(dir, "model", sharded.shards()));
  if (input.GetMeta<bool>(kWeightsOnlyKey).value_or(false)) return DataProto::Make({});
  DRAY_RETURN_IF_ERROR(SaveAdamWState(sharded, *state_->optimizer, dir));
  if (state_->config.sampling_policy()) {
    DRAY_RETURN_IF_ERROR(
        sharded.SaveShardedLike(dir, kSamplingPolicyName, state_->sampling_policy));
  }
  if (state_->config.dmd2()) {  // the fake score and its optimizer, in a folder of their own
    const std::string fake_dir = dir + "/" + kFakeScoreDir;
    FullyShardedModule& fake = *state_->fake_score.shards;
    std::error_code error;
    std::filesystem::create_directories(fake_dir, error);
    if (error) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create ", fake_dir, ": ", error.message()));
    }
    DRAY_RETURN_IF_ERROR(fake.SaveShardedLike(fake_dir, "model", fake.shards()));
    DRAY_RETURN_IF_ERROR(SaveAdamWState(fake, *state_->fake_optimizer, fake_dir));
  }
  return DataProto::Make({});
}

absl::StatusOr<DataProto> FlowGrpoWorker::LoadCheckpoint(const DataProto& input) {
  if (state_ == nullptr)
    return absl::FailedPreconditionError("call init_model before load_checkpoint");
  DRAY_ASSIGN_OR_RETURN(std::string dir, input.GetMeta<std::string>(kDirKey));
  FullyShardedModule& sharded = state_->trained();
  absl::Status loaded = sharded.LoadShardedLike(dir, "model", sharded.shards());
  const bool weights_only = input.GetMeta<bool>(kWeightsOnlyKey).value_or(false);
  if (loaded.ok() && !weights_only) loaded = LoadAdamWState(sharded, *state_->optimizer, dir);
  if (loaded.ok() && !weights_only && state_->config.sampling_policy())
    loaded = sharded.LoadShardedLike(dir, kSamplingPolicyName, state_->sampling_policy);
  if (loaded.ok() && !weights_only && state_->config.dmd2()) {
    FullyShardedModule& fake = *state_->fake_score.shards;
    const std::string fake_dir = dir + "/" + kFakeScoreDir;
    loaded = fake.LoadShardedLike(fake_dir, "model", fake.shards());
    if (loaded.ok()) loaded = LoadAdamWState(fake, *state_->fake_optimizer, fake_dir);
  }
  if (!loaded.ok()) {
    return absl::Status(loaded.code(), absl::StrCat("checkpoint ", dir,
                                                    " (saved with other "
                                                    "trainable parameters, e.g. another LoRA "
                                                    "rank?): ",
                                                    loaded.message()));
  }
  return DataProto::Make({});
}

}  // namespace dray
