// MixGRPO's sliding SDE window: which denoising steps of each training
// step's rollouts are stochastic and trained (the rest are ODE steps), as
// MixGRPO's GRPOTrainingStates moves it (Tencent-Hunyuan/MixGRPO,
// fastvideo/utils/grpo_states.py; tests/data/reference/mix_grpo/README.md,
// section a). The window [start, min(start + size, max_timesteps)) stays
// `iters_per_group` training steps, then moves `prog_overlap_step` steps
// later (`size` without overlap); past max_timesteps it rolls back to 0
// (or stays at max_timesteps, an empty window, without roll_back):
//
//   progressive  iters_per_group steps at each place
//   decay        int(max_iters (1 - p) + min_iters p), at least min_iters,
//                with p = start / max_timesteps
//   exp_decay    ceil(iters_per_group exp(-0.1 max(0, start - 13)))
//
// MixGRPO's fourth strategy, "random", draws the start each step; dray
// draws it as Flow-GRPO-Fast's window is drawn (PromptSampler).
//
//   MixGrpoWindowOptions options;  // MixGRPO's script: 25 steps, window 4, 25 iterations
//   options.max_timesteps = 25 - 2;
//   MixGrpoWindow window = MixGrpoWindowAt(options, step);  // [window.begin, window.end)
//
// Thread-safety: pure functions.
#ifndef DRAY_WORKERS_RL_MIX_GRPO_WINDOW_H_
#define DRAY_WORKERS_RL_MIX_GRPO_WINDOW_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace dray::rl {

struct MixGrpoWindowOptions {
  std::string strategy = "progressive";  // progressive, decay or exp_decay
  int64_t size = 4;                      // MixGRPO's group_size: steps in a window
  // Windows end before this step: MixGRPO trains a 25-step schedule's steps
  // 0..22 (max_timesteps = steps - 2).
  int64_t max_timesteps = 23;
  int64_t iters_per_group = 25;
  bool prog_overlap = true;  // move by prog_overlap_step, or by size
  int64_t prog_overlap_step = 1;
  bool roll_back = true;
  int64_t max_iters_per_group = 10;  // decay's
  int64_t min_iters_per_group = 1;
};

struct MixGrpoWindow {
  int64_t begin = 0;
  int64_t end = 0;            // begin == end: an empty window (nothing trained)
  int64_t iter_in_group = 0;  // training steps already spent at this place
};

// ValidateMixGrpoWindow: INVALID_ARGUMENT naming the algorithm.* key that is
// out of range.
absl::Status ValidateMixGrpoWindow(const MixGrpoWindowOptions& options);

// MixGrpoWindowAt: the window of training step `step` (0-based), stepping
// MixGRPO's state from the start (so a resumed run needs only its step).
MixGrpoWindow MixGrpoWindowAt(const MixGrpoWindowOptions& options, int64_t step);

}  // namespace dray::rl

#endif  // DRAY_WORKERS_RL_MIX_GRPO_WINDOW_H_
