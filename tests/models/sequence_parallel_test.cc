// Ulysses sequence parallelism on the parity configurations: the image
// tokens split over 2, 3 or 4 ranks (threads of this process in a real Gloo
// group), attention exchanging parts for heads, give one rank's output
// within 1e-5, with padding (tokens that do not divide), masked text, and
// Edit-2511's zero_cond_t modulation.
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "absl/strings/str_cat.h"
#include "base/cpu_threads.h"
#include "base/status_macros.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/collectives/local_group.h"
#include "tests/models/reference_transformer.h"
#include "workers/models/qwen_image/transformer.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

// Inputs: two samples whose target and condition images cover 5 x 3 tokens
// each (30 in all: no group of 4 divides them), the second with padded text.
struct Inputs {
  at::Tensor hidden, text, text_mask, timestep;
  std::vector<SampleImages> images;
};

Inputs MakeInputs(const TransformerConfig& config) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(11);
  Inputs in;
  in.hidden = at::randn({2, 30, config.in_channels}, generator, at::kFloat);
  in.text = at::randn({2, 9, config.joint_attention_dim}, generator, at::kFloat);
  in.text_mask = at::ones({2, 9}, at::kLong);
  in.text_mask[1].slice(0, 6).fill_(0);
  in.timestep = at::tensor({0.7, 0.3});
  in.images = {{{1, 5, 3}, {1, 5, 3}}, {{1, 5, 3}, {1, 5, 3}}};
  return in;
}

// LargestDifference runs `folder`'s transformer on the inputs over `ranks` ranks
// and returns the largest difference any rank's output has from one rank's.
double LargestDifference(const std::string& folder, int ranks, bool zero_cond_t) {
  torch::NoGradGuard no_grad;
  QwenImageTransformer whole = LoadReferenceTransformer(folder, zero_cond_t).value();
  const Inputs in = MakeInputs(whole->config());
  const at::Tensor expected =
      whole->forward(in.hidden, in.text, in.text_mask, in.timestep, in.images).value();
  std::vector<double> differences(ranks);
  const absl::Status run = RunLocalGroup(ranks, [&](int rank, Communicator* comm) -> absl::Status {
    UseOneCpuThreadPerCaller();
    torch::NoGradGuard no_grad;
    DRAY_ASSIGN_OR_RETURN(QwenImageTransformer model,
                          LoadReferenceTransformer(folder, zero_cond_t));
    DRAY_RETURN_IF_ERROR(model->set_sequence_group(comm));
    DRAY_ASSIGN_OR_RETURN(at::Tensor out,
                          model->forward(in.hidden, in.text, in.text_mask, in.timestep, in.images));
    differences[rank] = (out - expected).abs().max().item<double>();
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << run;
  return *std::max_element(differences.begin(), differences.end());
}

TEST(SequenceParallelTest, TwoAndFourRanksGiveOneRanksOutput) {
  for (int ranks : {2, 4}) {
    for (bool zero_cond_t : {false, true}) {
      EXPECT_LE(LargestDifference("transformer_small", ranks, zero_cond_t), 1e-5)
          << ranks << " ranks, zero_cond_t " << zero_cond_t;
    }
  }
}

TEST(SequenceParallelTest, ThreeHeadsOverThreeRanks) {
  EXPECT_LE(LargestDifference("transformer_tiny", 3, false), 1e-5);
}

TEST(SequenceParallelTest, RefusesHeadsThatDoNotDivideAndGradients) {
  DRAY_EXPECT_OK(RunLocalGroup(2, [](int, Communicator* comm) -> absl::Status {
    DRAY_ASSIGN_OR_RETURN(QwenImageTransformer tiny, LoadReferenceTransformer("transformer_tiny"));
    EXPECT_THAT(tiny->set_sequence_group(comm),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr("needs the attention heads (3) to divide by it")));
    DRAY_ASSIGN_OR_RETURN(QwenImageTransformer small,
                          LoadReferenceTransformer("transformer_small"));
    DRAY_RETURN_IF_ERROR(small->set_sequence_group(comm));
    const Inputs in = MakeInputs(small->config());
    EXPECT_THAT(small->forward(in.hidden, in.text, in.text_mask, in.timestep, in.images),
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("without gradients")));
    return absl::OkStatus();
  }));
}

}  // namespace
}  // namespace dray::qwen_image
