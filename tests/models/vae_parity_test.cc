// Parity of AutoencoderKLQwenImage with diffusers on every case in
// reference/qwen_image/vae_{tiny,default_small}: encode (all distribution
// fields), decode, encode-decode, and the pipeline's normalized image
// latents, single- and multi-frame, within atol = rtol = 1e-5.
#include <filesystem>
#include <string>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "dispatch/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/safetensors.h"
#include "tests/models/reference.h"
#include "workers/models/layers.h"
#include "workers/models/qwen_image/vae.h"

namespace dray::qwen_image {
namespace {

using ::dray::testing::StatusIs;

bool AllClose(const at::Tensor& a, const at::Tensor& b, double atol, double rtol) {
  return a.sizes() == b.sizes() && ((a - b).abs() <= atol + rtol * b.abs()).all().item<bool>();
}

AutoencoderKLQwenImage LoadVae(const std::string& folder) {
  auto config = VaeConfig::FromFile(ReferencePath(folder + "/config.json"));
  EXPECT_TRUE(config.ok()) << config.status();
  AutoencoderKLQwenImage vae(*config, at::TensorOptions().dtype(at::kFloat));
  const absl::Status loaded = LoadStateDict(*vae, Checkpoint::Open(ReferencePath(folder)).value());
  EXPECT_TRUE(loaded.ok()) << loaded;
  return vae;
}

struct Case {
  std::string folder;
  std::string file;
};

class VaeParityTest : public ::testing::TestWithParam<Case> {
 protected:
  void Expect(const std::string& name, const at::Tensor& actual) {
    const at::Tensor expected = file_->Get(name).value();
    RecordProperty(name, absl::StrCat(MaxAbsDiff(actual, expected)));
    EXPECT_TRUE(AllClose(actual, expected, 1e-5, 1e-5)) << name << ": max abs diff " << MaxAbsDiff(actual, expected);
  }
  std::shared_ptr<const SafetensorsFile> file_;
};

TEST_P(VaeParityTest, MatchesDiffusers) {
  const Case& c = GetParam();
  file_ = SafetensorsFile::Open(ReferencePath(c.folder + "/" + c.file)).value();
  AutoencoderKLQwenImage vae = LoadVae(c.folder);
  if (c.file.rfind("case_decode", 0) == 0) {
    DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor sample, vae->Decode(file_->Get("z").value()));
    Expect("sample", sample);
  } else if (c.file.rfind("case_forward", 0) == 0) {
    DRAY_ASSERT_OK_AND_ASSIGN(LatentDistribution dist, vae->Encode(file_->Get("x").value()));
    DRAY_ASSERT_OK_AND_ASSIGN(at::Tensor sample, vae->Decode(dist.mean));
    Expect("sample", sample);
  } else if (c.file.rfind("case_pipeline_encode", 0) == 0) {
    DRAY_ASSERT_OK_AND_ASSIGN(LatentDistribution dist, vae->Encode(file_->Get("x").value()));
    Expect("image_latents", vae->Normalize(dist.mean));
  } else {
    DRAY_ASSERT_OK_AND_ASSIGN(LatentDistribution dist, vae->Encode(file_->Get("x").value()));
    Expect("latent_dist.parameters", dist.parameters);
    Expect("latent_dist.mean", dist.mean);
    Expect("latent_dist.logvar", dist.logvar);
    Expect("latent_dist.std", dist.std);
    Expect("latent_dist.var", dist.var);
    Expect("latent_dist.mode", dist.mean);
  }
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const std::string folder : {"vae_tiny", "vae_default_small"}) {
    for (const auto& entry : std::filesystem::directory_iterator(ReferencePath(folder))) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("case_", 0) == 0) cases.push_back({folder, name});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Reference, VaeParityTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.folder + "_" + info.param.file;
                           return name.substr(0, name.find('.'));
                         });

TEST(VaeTest, RejectsBadShapes) {
  AutoencoderKLQwenImage vae = LoadVae("vae_tiny");
  EXPECT_THAT(vae->Encode(at::zeros({1, 3, 1, 30, 48})),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("multiples of 4, got [1, 3, 1, 30, 48]")));
  EXPECT_THAT(vae->Encode(at::zeros({1, 3, 2, 32, 48})), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(vae->Decode(at::zeros({1, 5, 1, 4, 4})),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("needs [B, 4, T, h, w]")));
}

TEST(VaeTest, RealConfigBuildsOnTheMetaDevice) {
  AutoencoderKLQwenImage vae(VaeConfig(), at::TensorOptions().device(at::kMeta));
  EXPECT_EQ(ParameterCount(*vae), 126892531);
}

}  // namespace
}  // namespace dray::qwen_image
