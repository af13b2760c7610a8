// QwenImageEditWorker end to end: real `dray worker` processes on the tiny
// model, driven by ImageEditController over gRPC, compared with the edit
// pipeline run in this process.
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/cpu_bfloat16.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/edit/edit_test_util.h"
#include "workers/edit/image_edit_controller.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_config.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

class ImageEditWorkerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    controller_ = StartTestController(TestConfig(), 2).value().release();
  }
  static void TearDownTestSuite() { delete controller_; }
  static ImageEditController* controller_;
};
ImageEditController* ImageEditWorkerTest::controller_ = nullptr;

TEST_F(ImageEditWorkerTest, InitModelRanOnEveryRank) {
  const std::vector<DataProto> results = controller_->init_results();
  ASSERT_EQ(results.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const DataProto& result = results[rank];
    EXPECT_EQ(result.GetMeta<int64_t>("rank").value(), rank);
    EXPECT_GT(result.GetMeta<int64_t>("parameter_bytes").value(), 0);
  }
}

TEST_F(ImageEditWorkerTest, FiveImagesOverTwoWorkersKeepTheirOrder) {
  const TestBatch batch = MakeTestBatch(5);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto edited, controller_->Edit(batch.data));
  ASSERT_EQ(edited.size(), 5);
  const std::vector<at::Tensor> expected = EditInProcess(TestConfig(), batch);
  const std::vector<at::Tensor> images = EditedImages(edited);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(at::equal(images[i], expected[i]))
        << "row " << i << " differs from the same row edited here";
  }
  // process_batch is edit_images_batch under its other name (called here
  // past the controller, so with the seeds the controller would add).
  DRAY_ASSERT_OK_AND_ASSIGN(
      std::vector<DataProto> alias,
      controller_->group()->Call("process_batch",
                                 {WithSeeds(batch.data, TestConfig().seed).value()}));
  EXPECT_TRUE(SameDataProto(alias.front(), edited));
}

TEST_F(ImageEditWorkerTest, BadRowsAreNamedBeforeDispatch) {
  TestBatch batch = MakeTestBatch(4);
  std::vector<Bytes> pngs = batch.pngs;
  std::vector<std::string> instructions = batch.instructions;
  pngs[2] = "this is not an image";
  EXPECT_THAT(controller_->Edit(MakeEditBatch(pngs, instructions).value()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("row 2: image data (20 bytes) is neither PNG nor JPEG")));
  pngs = batch.pngs;
  instructions[3] = "  ";
  EXPECT_THAT(
      controller_->Edit(MakeEditBatch(pngs, instructions).value()),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 3: the instruction is empty")));
  instructions = batch.instructions;
  pngs[0] = EncodeTestImage(at::zeros({4096, 4097, 3}, at::kByte));
  EXPECT_THAT(controller_->Edit(MakeEditBatch(pngs, instructions).value()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("row 0: image is 4097x4096")));
}

TEST_F(ImageEditWorkerTest, WorkersRefuseBadRowsThemselvesAndKeepServing) {
  TestBatch batch = MakeTestBatch(4);
  std::vector<Bytes> pngs = batch.pngs;
  pngs[3] = std::string(pngs[3].view().substr(0, 40));  // truncated
  // Straight to the workers, past the controller's checks: rank 1 holds rows
  // 2 and 3, its rows 0 and 1.
  EXPECT_THAT(controller_->group()->Call("edit_images_batch",
                                         {MakeEditBatch(pngs, batch.instructions).value()}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("rank 1"), HasSubstr("row 1: not a readable PNG"))));
  DRAY_EXPECT_OK(controller_->Edit(batch.data).status());
}

// EditedIn: `batch` edited by 2 workers configured with `overrides`, and
// rank 1's parameter bytes in the transformer's blocks.
struct EditedIn {
  EditedIn(const std::vector<std::string>& overrides, const TestBatch& batch) {
    absl::StatusOr<std::unique_ptr<ImageEditController>> controller =
        StartTestController(TestConfig(overrides), 2);
    EXPECT_TRUE(controller.ok()) << controller.status();
    if (!controller.ok()) return;
    block_bytes =
        (*controller)->init_results()[1].GetMeta<int64_t>("block_model_parameter_bytes").value();
    absl::StatusOr<DataProto> edited = (*controller)->Edit(batch.data);
    EXPECT_TRUE(edited.ok()) << edited.status();
    if (edited.ok()) images = EditedImages(*edited);
  }
  std::vector<at::Tensor> images;
  int64_t block_bytes = 0;
};

// ExpectLevelsApart: every image within `max_levels` (of 255) of its twin,
// and on average within `mean_levels`.
void ExpectLevelsApart(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b,
                       double max_levels, double mean_levels) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const at::Tensor levels = (a[i].to(at::kFloat) - b[i].to(at::kFloat)).abs();
    EXPECT_LE(levels.max().item<double>(), max_levels) << "row " << i;
    EXPECT_LE(levels.mean().item<double>(), mean_levels) << "row " << i;
  }
}

TEST(ImageEditWorkerModesTest, ShardingAndOffloadDoNotChangeTheImages) {
  const TestBatch batch = MakeTestBatch(3);
  const EditedIn replicated({}, batch);
  for (const std::vector<std::string>& overrides : std::vector<std::vector<std::string>>{
           {"worker.image_edit.enable_fsdp=true"},
           {"worker.image_edit.enable_fsdp=true",
            "worker.image_edit.fsdp_sharding_strategy=SHARD_GRAD_OP",
            "worker.image_edit.fsdp_sync_module_states=false"},
           {"worker.image_edit.enable_cpu_offload=true"},
           {"worker.image_edit.enable_fsdp=true", "worker.image_edit.enable_cpu_offload=true",
            "worker.image_edit.fsdp_cpu_offload=true"}}) {
    SCOPED_TRACE(absl::StrJoin(overrides, " "));
    const EditedIn mode(overrides, batch);
    if (overrides[0] == "worker.image_edit.enable_fsdp=true") {
      EXPECT_LT(mode.block_bytes, replicated.block_bytes * 3 / 4)
          << "rank 1 should hold about half of the blocks";
    }
    ExpectLevelsApart(mode.images, replicated.images, 0, 0);
  }
}

TEST(ImageEditWorkerModesTest, BFloat16ShardsHalveTheParametersAndEditAlike) {
  const std::vector<std::string> sharded = {"worker.image_edit.enable_fsdp=true"};
  std::vector<std::string> bfloat16 = sharded;
  bfloat16.push_back("worker.image_edit.torch_dtype=bfloat16");
  if (!CpuBfloat16Support().ok()) {  // LibTorch's bfloat16 CPU kernels would die or refuse
    EXPECT_THAT(ImageEditConfig::Load("", bfloat16),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bfloat16 cannot run")));
    return;
  }
  const TestBatch batch = MakeTestBatch(3);
  const EditedIn full(sharded, batch), half(bfloat16, batch);
  // Nothing trains in an edit worker: its shards are stored in the compute dtype.
  EXPECT_LT(half.block_bytes, full.block_bytes * 6 / 10);
  ExpectLevelsApart(half.images, full.images, 255, 2.0);
}

// float64 (numerics checks): shards twice float32's, the same images but
// for a level where float32 rounded a pixel across a step.
TEST(ImageEditWorkerModesTest, Float64ShardsDoubleTheParametersAndEditAlike) {
  const std::vector<std::string> sharded = {"worker.image_edit.enable_fsdp=true"};
  std::vector<std::string> float64 = sharded;
  float64.push_back("worker.image_edit.torch_dtype=float64");
  const TestBatch batch = MakeTestBatch(3);
  const EditedIn in32(sharded, batch), in64(float64, batch);
  EXPECT_EQ(in64.block_bytes, 2 * in32.block_bytes);
  ExpectLevelsApart(in64.images, in32.images, 1, 1);
}

}  // namespace
}  // namespace dray
