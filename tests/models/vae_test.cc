// Unit tests of AutoencoderKLQwenImage beyond parity (which parity_test
// covers): input checks and the real configuration on the meta device.
#include <string>

#include <ATen/ATen.h>

#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/io/safetensors.h"
#include "tests/models/reference.h"
#include "workers/models/component_weights.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/vae.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;

AutoencoderKLQwenImage LoadVae(const std::string& folder) {
  auto config = VaeConfig::FromFile(ReferencePath(folder + "/config.json"));
  EXPECT_TRUE(config.ok()) << config.status();
  AutoencoderKLQwenImage vae(*config, at::TensorOptions().dtype(at::kFloat));
  const absl::Status loaded =
      LoadStateDict(*vae, OpenComponentWeights(ReferencePath(folder)).value());
  EXPECT_TRUE(loaded.ok()) << loaded;
  return vae;
}

TEST(VaeTest, RejectsBadShapes) {
  AutoencoderKLQwenImage vae = LoadVae("vae_tiny");
  EXPECT_THAT(vae->Encode(at::zeros({1, 3, 1, 30, 48})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("multiples of 4, got [1, 3, 1, 30, 48]")));
  EXPECT_THAT(vae->Encode(at::zeros({1, 3, 2, 32, 48})),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      vae->Decode(at::zeros({1, 5, 1, 4, 4})),
      StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("needs [B, 4, T, h, w]")));
}

TEST(VaeTest, RealConfigBuildsOnTheMetaDevice) {
  AutoencoderKLQwenImage vae(VaeConfig(), at::TensorOptions().device(at::kMeta));
  EXPECT_EQ(ParameterCount(*vae), 126892531);
}

}  // namespace
}  // namespace dray::qwen_image
