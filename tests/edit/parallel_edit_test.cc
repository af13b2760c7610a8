// One edit spread over several `dray worker` processes: CFG parallelism
// gives the images one rank computes bit for bit, alone and under FSDP;
// Ulysses sequence parallelism, alone and with it, within a level; the
// ranks of an edit stop together; a call that gives them different rows,
// and layouts the workers or heads cannot hold, are refused. A step cache
// counts the passes it reuses.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/edit/edit_test_util.h"
#include "workers/edit/image_edit_controller.h"
#include "workers/edit/image_edit_worker.h"
#include "workers/models/qwen_image/embedded_model.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_config.h"

namespace dray {
namespace {

using ::dray::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kCfgParallel[] = "worker.image_edit.cfg_parallel_size=2";

// EmbeddedModelDir: the embedded model (4 attention heads, unlike the tiny
// model's 3), written once per test binary.
std::string EmbeddedModelDir() {
  static const std::string dir = [] {
    const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/embedded");
    EXPECT_TRUE(qwen_image::WriteEmbeddedModel(path).ok());
    return path;
  }();
  return dir;
}

// ExpectWithinALevel: every pixel of each image within one level (of 255)
// of its twin's: the velocities differ by rounding (< 1e-5).
void ExpectWithinALevel(const DataProto& edited, const std::vector<at::Tensor>& expected) {
  const std::vector<at::Tensor> images = EditedImages(edited);
  ASSERT_EQ(images.size(), expected.size());
  for (size_t i = 0; i < images.size(); ++i) {
    EXPECT_LE((images[i].to(at::kInt) - expected[i].to(at::kInt)).abs().max().item<int>(), 1)
        << "row " << i;
  }
}

void ExpectSameImages(const DataProto& edited, const std::vector<at::Tensor>& expected) {
  const std::vector<at::Tensor> images = EditedImages(edited);
  ASSERT_EQ(images.size(), expected.size());
  for (size_t i = 0; i < images.size(); ++i)
    EXPECT_TRUE(at::equal(images[i], expected[i])) << "row " << i << " differs from one rank's";
}

class CfgParallelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    controller_ = StartTestController(TestConfig({kCfgParallel}), 4).value().release();
  }
  static void TearDownTestSuite() { delete controller_; }
  static ImageEditController* controller_;
};
ImageEditController* CfgParallelTest::controller_ = nullptr;

// Four workers, two edits at a time, each over two of them: the images one
// process computes alone.
TEST_F(CfgParallelTest, PairsOfRanksEditAsOneRankDoes) {
  const TestBatch batch = MakeTestBatch(3);
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto edited, controller_->Edit(batch.data));
  ExpectSameImages(edited, EditInProcess(TestConfig(), batch));
}

// Both ranks of an edit stop after the same step when its caller cancels.
TEST_F(CfgParallelTest, TheRanksOfAnEditStopTogether) {
  const TestBatch batch = MakeTestBatch(1);
  DataProto slow = batch.data;
  slow.SetMeta("num_inference_steps", int64_t{50});
  absl::Notification first_step;
  absl::StatusOr<DataProto> cancelled =
      controller_->Edit(slow, std::nullopt, [&](int64_t done, int64_t) {
        if (done == 1 && !first_step.HasBeenNotified()) {
          first_step.Notify();
          controller_->CancelRunning(absl::CancelledError("the caller went away"));
        }
      });
  // Rank 0 names the reason, or that its partner stopped, whichever it saw first.
  EXPECT_THAT(cancelled, StatusIs(absl::StatusCode::kCancelled, HasSubstr("stopped after step")));
  // Neither rank is left waiting for the other: the next edit runs.
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto edited, controller_->Edit(batch.data));
  ExpectSameImages(edited, EditInProcess(TestConfig(), batch));
}

// A caller past the controller that splits rows over every rank gets an
// error naming the option, and the workers keep serving.
TEST_F(CfgParallelTest, RanksOfOneEditGivenDifferentRowsRefuse) {
  const TestBatch batch = MakeTestBatch(4);
  // Without seeds every rank's one row gets the same seed: the rows differ
  // in their pictures and instructions alone.
  for (const DataProto& rows : {batch.data, WithSeeds(batch.data, TestConfig().seed).value()}) {
    EXPECT_THAT(
        controller_->group()->Call("edit_images_batch", {rows}),
        StatusIs(absl::StatusCode::kFailedPrecondition,
                 AllOf(HasSubstr("were given different rows"), HasSubstr("rank_group_size = 2"))));
  }
  DRAY_EXPECT_OK(controller_->Edit(batch.data).status());
}

// With FSDP the pair shards the blocks and splits the passes: still the
// images of one rank.
TEST(CfgParallelModesTest, ShardedPairsEditAsOneRankDoes) {
  const TestBatch batch = MakeTestBatch(2);
  DRAY_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ImageEditController> controller,
      StartTestController(TestConfig({kCfgParallel, "worker.image_edit.enable_fsdp=true"}), 2));
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto edited, controller->Edit(batch.data));
  ExpectSameImages(edited, EditInProcess(TestConfig(), batch));
}

// Ulysses over 2 ranks, then with CFG over 2 x 2: the embedded model's
// images within a level of one rank's.
TEST(UlyssesTest, SequencePartsAloneAndWithCfgEditAsOneRankDoes) {
  const TestBatch batch = MakeTestBatch(3);
  const std::string model = absl::StrCat("worker.image_edit.model_path=", EmbeddedModelDir());
  const std::vector<at::Tensor> expected = EditInProcess(TestConfig({model}), batch);
  for (const auto& [workers, layout] : std::vector<std::pair<int, std::vector<std::string>>>{
           {2, {model, "worker.image_edit.ulysses_degree=2"}},
           {4, {model, "worker.image_edit.ulysses_degree=2", kCfgParallel}}}) {
    SCOPED_TRACE(absl::StrCat(workers, " workers"));
    DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ImageEditController> controller,
                              StartTestController(TestConfig(layout), workers));
    DRAY_ASSERT_OK_AND_ASSIGN(DataProto edited, controller->Edit(batch.data));
    ExpectWithinALevel(edited, expected);
  }
}

// A step cache's result counts each row's reused passes; at threshold 0 it
// is the exact edit; it cannot run where FSDP gathers every block.
TEST(StepCacheEditTest, RowsCountTheirReusedPassesAndThresholdZeroIsExact) {
  const TestBatch batch = MakeTestBatch(2);
  DRAY_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ImageEditController> controller,
                            StartTestController(TestConfig(), 1));
  DataProto cached = batch.data;
  cached.SetMeta("num_inference_steps", int64_t{8});
  cached.SetMeta("step_cache_threshold", 10.0);  // every pass after the warm-up reuses
  DRAY_ASSERT_OK_AND_ASSIGN(DataProto edited, controller->Edit(cached));
  // 8 steps, guided: 16 passes a row, the first 2 steps' 4 computed.
  EXPECT_TRUE(
      at::equal(edited.GetTensor(kTransformerPassesColumn).value(), at::full({2}, 16, at::kLong)));
  EXPECT_TRUE(
      at::equal(edited.GetTensor(kReusedPassesColumn).value(), at::full({2}, 12, at::kLong)));
  cached.SetMeta("step_cache_threshold", 0.0);
  DRAY_ASSERT_OK_AND_ASSIGN(edited, controller->Edit(cached));
  ExpectSameImages(edited,
                   EditInProcess(TestConfig({"worker.image_edit.num_inference_steps=8"}), batch));
  EXPECT_THAT(
      ImageEditConfig::Load(
          "", {"worker.image_edit.enable_fsdp=true", "worker.image_edit.step_cache_threshold=0.1"}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be 0 with enable_fsdp")));
}

TEST(EditLayoutTest, WorkersOrHeadsTheLayoutDoesNotDivideAreRefused) {
  EXPECT_THAT(StartTestController(TestConfig({kCfgParallel}), 3),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("cfg_parallel_size 2 (--cfg-parallel-size) x "
                                       "worker.image_edit.ulysses_degree 1 (--ulysses-degree)"),
                             HasSubstr("3 workers (1 node(s) x --workers 3) are not a "
                                       "multiple of 2"))));
  EXPECT_THAT(StartTestController(TestConfig({"worker.image_edit.ulysses_degree=2"}), 2),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("ulysses_degree 2 does not divide the transformer's 3 "
                                 "attention heads")));
}

}  // namespace
}  // namespace dray
