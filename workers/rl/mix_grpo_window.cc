#include "workers/rl/mix_grpo_window.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace dray::rl {
namespace {

// ItersAt: how many training steps the window stays at `start`.
double ItersAt(const MixGrpoWindowOptions& options, int64_t start) {
  if (options.strategy == "decay") {
    const double progress = static_cast<double>(start) / static_cast<double>(options.max_timesteps);
    const auto iters = static_cast<int64_t>(options.max_iters_per_group * (1 - progress) +
                                            options.min_iters_per_group * progress);
    return static_cast<double>(std::max(options.min_iters_per_group, iters));
  }
  if (options.strategy == "exp_decay") {
    constexpr int64_t kThreshold = 13;  // MixGRPO's exp_decay_thre_timestep
    constexpr double kRate = 0.1;       // its exp_decay_k
    return std::ceil(
        static_cast<double>(options.iters_per_group) *
        std::exp(-kRate * static_cast<double>(std::max<int64_t>(0, start - kThreshold))));
  }
  return static_cast<double>(options.iters_per_group);
}

}  // namespace

absl::Status ValidateMixGrpoWindow(const MixGrpoWindowOptions& options) {
  auto bad = [](const char* key, const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("algorithm.", key, " ", why));
  };
  if (options.strategy != "progressive" && options.strategy != "decay" &&
      options.strategy != "exp_decay" && options.strategy != "random")
    return bad(
        "sample_strategy",
        absl::StrCat("'", options.strategy, "' must be progressive, decay, exp_decay or random"));
  if (options.size < 1) return bad("sde_window_size", "must be at least 1 for mix_grpo");
  if (options.max_timesteps < options.size)
    return bad("sde_window_size",
               absl::StrCat("must leave room in the ", options.max_timesteps,
                            " trainable steps (mix_grpo trains steps 0..num_inference_steps-3)"));
  if (options.iters_per_group < 1) return bad("iters_per_group", "must be at least 1");
  if (options.prog_overlap_step < 0) return bad("prog_overlap_step", "must be >= 0");
  if (options.min_iters_per_group < 1) return bad("min_iters_per_group", "must be at least 1");
  if (options.max_iters_per_group < options.min_iters_per_group)
    return bad("max_iters_per_group", "must be >= algorithm.min_iters_per_group");
  return absl::OkStatus();
}

MixGrpoWindow MixGrpoWindowAt(const MixGrpoWindowOptions& options, int64_t step) {
  int64_t start = 0, iter = 0;
  for (int64_t s = 0; s < step; ++s) {  // MixGRPO's update_iteration
    if (++iter >= ItersAt(options, start)) {
      iter = 0;
      start += options.prog_overlap ? options.prog_overlap_step : options.size;
    }
    if (start > options.max_timesteps) {
      if (options.roll_back) {
        start = 0;
        iter = 0;
      } else {
        start = options.max_timesteps;
      }
    }
  }
  return {start, std::min(start + options.size, options.max_timesteps), iter};
}

}  // namespace dray::rl
