// ImageEditConfig: the seeds' YAML layout, dotted overrides, and errors
// that name the key (listing the valid ones for an unknown key).
#include "workers/pipeline/edit_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "base/cpu_bfloat16.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "workers/config/cluster_config.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::HasSubstr;

std::string WriteYaml(const std::string& name, const std::string& text) {
  const std::string path = (std::filesystem::path(std::getenv("TEST_TMPDIR")) / name).string();
  std::ofstream(path) << text;
  return path;
}

TEST(ImageEditConfigTest, ReadsTheFileThenOverrides) {
  const std::string path = WriteYaml("job.yaml", R"(
worker:
  image_edit:
    model_path: /models/qwen-image-edit
    enable_fsdp: true
    fsdp_sharding_strategy: SHARD_GRAD_OP
    torch_dtype: bfloat16
    batch_size: 8
    true_cfg_scale: 3.5
    negative_prompt: "blurry"
    device: cuda
)");
  DRAY_ASSERT_OK_AND_ASSIGN(
      ImageEditConfig config,
      ImageEditConfig::Load(
          path, {"worker.image_edit.batch_size=2", "worker.image_edit.enable_cpu_offload=true"}));
  EXPECT_EQ(config.model_path, "/models/qwen-image-edit");
  EXPECT_TRUE(config.enable_fsdp);
  EXPECT_EQ(config.fsdp_sharding_strategy, "SHARD_GRAD_OP");
  EXPECT_EQ(config.torch_dtype, "bfloat16");
  EXPECT_EQ(config.batch_size, 2);  // the override wins
  EXPECT_TRUE(config.enable_cpu_offload);
  EXPECT_DOUBLE_EQ(config.true_cfg_scale, 3.5);
  EXPECT_EQ(config.negative_prompt, "blurry");
  EXPECT_EQ(config.num_inference_steps, 50);  // untouched default
  // The resolved configuration reads back as itself.
  const std::string resolved = WriteYaml("resolved.yaml", config.ToYaml());
  DRAY_ASSERT_OK_AND_ASSIGN(ImageEditConfig reread, ImageEditConfig::Load(resolved, {}));
  EXPECT_EQ(reread.ToYaml(), config.ToYaml());
  DRAY_ASSERT_OK_AND_ASSIGN(ImageEditConfig from_text, ImageEditConfig::FromYaml(config.ToYaml()));
  EXPECT_EQ(from_text.ToYaml(), config.ToYaml());
}

TEST(ImageEditConfigTest, ReadsOtherSectionsThroughMoreKeys) {
  const std::string path = WriteYaml("serve.yaml", R"(
worker:
  image_edit:
    batch_size: 2
cluster:
  nodes: 2
  listen: controller:29400
)");
  ClusterConfig cluster;
  DRAY_ASSERT_OK_AND_ASSIGN(
      ImageEditConfig config,
      ImageEditConfig::Load(path, {"cluster.tls_mutual=true"}, ClusterConfigKeys(cluster)));
  EXPECT_EQ(config.batch_size, 2);
  EXPECT_EQ(cluster.nodes, 2);
  EXPECT_EQ(cluster.listen, "controller:29400");
  EXPECT_TRUE(cluster.tls_mutual);
  EXPECT_THAT(ImageEditConfig::Load(path, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cluster")));
}

TEST(ImageEditConfigTest, TheEmbeddedDefaultRunsFewerStepsAtASmallerSizeWithoutGuidance) {
  DRAY_ASSERT_OK_AND_ASSIGN(ImageEditConfig config, ImageEditConfig::Load("", {}));
  EXPECT_TRUE(config.model_path.empty());
  EXPECT_EQ(config.num_inference_steps, kEmbeddedSteps);
  EXPECT_EQ(config.image_size, kEmbeddedImageSize);
  EXPECT_EQ(config.negative_prompt, "");
  EXPECT_THAT(config.ToYaml(), HasSubstr("image_edit:"));
  // Keys that are set keep their values; a model path brings the full defaults back.
  DRAY_ASSERT_OK_AND_ASSIGN(config,
                            ImageEditConfig::Load("", {"worker.image_edit.num_inference_steps=3"}));
  EXPECT_EQ(config.num_inference_steps, 3);
  EXPECT_EQ(config.image_size, kEmbeddedImageSize);
  DRAY_ASSERT_OK_AND_ASSIGN(config, ImageEditConfig::Load("", {"worker.image_edit.model_path=/m"}));
  EXPECT_EQ(config.num_inference_steps, 50);
  EXPECT_EQ(config.image_size, 1024);
  EXPECT_EQ(config.negative_prompt, " ");
}

// What a command's summary says of guidance: never silent about a
// true_cfg_scale that does nothing.
TEST(ImageEditConfigTest, TheGuidanceSummarySaysWhichGuidanceRuns) {
  ImageEditConfig config;
  config.negative_prompt = " ";
  config.true_cfg_scale = 4;
  EXPECT_EQ(config.GuidanceSummary(ModelFamily::kQwenImage), "true CFG 4 against \" \"");
  config.negative_prompt = "";
  EXPECT_EQ(config.GuidanceSummary(ModelFamily::kQwenImage), "no true CFG (no negative_prompt)");
  config.UseKontextDefaults();
  EXPECT_EQ(config.GuidanceSummary(ModelFamily::kFluxKontext),
            "guidance 3.5, no true CFG (no negative_prompt)");
  config.negative_prompt = "blurry";
  EXPECT_EQ(config.GuidanceSummary(ModelFamily::kFluxKontext),
            "guidance 3.5, no true CFG (true_cfg_scale 1)");
}

TEST(ImageEditConfigTest, UnknownKeysListTheValidOnes) {
  EXPECT_THAT(
      ImageEditConfig::Load("", {"worker.image_edit.batchsize=2"}),
      StatusIs(
          absl::StatusCode::kInvalidArgument,
          HasSubstr(
              "unknown key worker.image_edit.batchsize; valid keys: model_path, enable_fsdp")));
  const std::string path = WriteYaml("bad_key.yaml", "worker:\n  image_edit:\n    steps: 3\n");
  EXPECT_THAT(ImageEditConfig::Load(path, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("steps")));
  const std::string top = WriteYaml("bad_top.yaml", "trainer:\n  epochs: 3\n");
  EXPECT_THAT(ImageEditConfig::Load(top, {}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown key trainer; valid keys: worker")));
}

TEST(ImageEditConfigTest, WrongTypesAndValuesNameTheKey) {
  EXPECT_THAT(
      ImageEditConfig::Load("", {"worker.image_edit.enable_fsdp=maybe"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("enable_fsdp must be true or false")));
  EXPECT_THAT(
      ImageEditConfig::Load("", {"worker.image_edit.batch_size=[1, 2]"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch_size must be an integer")));
  EXPECT_THAT(
      ImageEditConfig::Load("", {"worker.image_edit.batch_size=0"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("batch_size must be at least 1")));
  EXPECT_THAT(ImageEditConfig::Load("", {"worker.image_edit.torch_dtype=float8"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("torch_dtype 'float8' is not one of float32, bfloat16, float16, "
                                 "float64")));
  DRAY_EXPECT_OK(ImageEditConfig::Load("", {"worker.image_edit.torch_dtype=float64"}).status());
  EXPECT_THAT(ImageEditConfig::Load("", {"worker.image_edit.torch_dtype=float16"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("float16 needs device cuda")));
  EXPECT_THAT(ImageEditConfig::Load("", {"worker.image_edit.device=cuda:1"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("is not cpu or cuda")));
  const absl::StatusOr<ImageEditConfig> bfloat16 =
      ImageEditConfig::Load("", {"worker.image_edit.torch_dtype=bfloat16"});
  if (CpuBfloat16Support().ok()) {
    DRAY_EXPECT_OK(bfloat16.status());
  } else {  // LibTorch's bfloat16 CPU kernels would die or refuse
    EXPECT_THAT(bfloat16,
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bfloat16 cannot run")));
  }
  EXPECT_THAT(ImageEditConfig::Load("", {"worker.image_edit.fsdp_sharding_strategy=HALF"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("fsdp_sharding_strategy")));
  EXPECT_THAT(ImageEditConfig::Load("", {"batch_size=2"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown key batch_size; valid keys: worker")));
  EXPECT_THAT(ImageEditConfig::Load("", {"worker.image_edit.batch_size"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must read KEY=VALUE")));
  EXPECT_THAT(ImageEditConfig::Load("/nonexistent.yaml", {}),
              StatusIs(absl::StatusCode::kNotFound));
  const std::string broken = WriteYaml("broken.yaml", "worker: [unclosed\n");
  EXPECT_THAT(ImageEditConfig::Load(broken, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid YAML")));
  EXPECT_THAT(ImageEditConfig::FromYaml("worker:\n  image_edit:\n    seed: -1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("seed must be >= 0")));
}

}  // namespace
}  // namespace dray
