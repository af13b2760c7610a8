// TrainDashboard over a run's folder written here: real HTTP on loopback,
// no trainer.
#include "workers/train/train_dashboard.h"

#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "base/files.h"
#include "base/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dray {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

class TrainDashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.emplace(ScratchDir::Create("dashboard-test").value());
    const fs::path run = dir_->path();
    Write(run / "config.yaml", "trainer:\n  total_steps: 8\n");
    Write(run / "metrics.jsonl",
          "{\"step\": 1, \"reward_mean\": 0.25, \"loss\": 0.5, \"rollout_s\": 1.5}\n"
          "{\"step\": 2, \"reward_mean\": 0.5, \"reward/target_psnr\": 0.5, \"images_per_s\": 3,"
          " \"loss\": 0.25, \"rollout_s\": 1.25}\n"
          "{\"step\": 3, \"rew");  // a line being written
    Write(run / "samples/step_2.png", "a sample grid");
    Write(run / "samples/step_10.png", "a later one");
    Write(run / "samples/notes.txt", "not a sample");
    Write(run / "checkpoints/step_000002/trainer_state.json", "{}");
    Write(run / "checkpoints/.step_000004.partial/shard", "");  // not complete
    TrainConfig config;
    config.save_dir = run.string();
    config.total_steps = 8;
    DashboardOptions options;
    options.http.address = "127.0.0.1:0";
    options.restarts = [] { return 1; };
    dashboard_ = TrainDashboard::Start(config, options).value();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", dashboard_->port());
  }

  std::optional<ScratchDir> dir_;
  std::unique_ptr<TrainDashboard> dashboard_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(TrainDashboardTest, TheRunAsItStandsOnDisk) {
  httplib::Result result = client_->Get("/api/run");
  ASSERT_EQ(result->status, 200);
  const nlohmann::json run = nlohmann::json::parse(result->body);
  EXPECT_EQ(run["config"], "trainer:\n  total_steps: 8\n");
  EXPECT_EQ(run["total_steps"], 8);
  EXPECT_EQ(run["restarts"], 1);
  ASSERT_EQ(run["steps"].size(), 2u);  // not the line being written
  EXPECT_EQ(run["steps"][1]["reward_mean"], 0.5);
  EXPECT_THAT(run["samples"].get<std::vector<std::string>>(),
              ElementsAre("step_2.png", "step_10.png"));
  EXPECT_THAT(run["checkpoints"].get<std::vector<std::string>>(), ElementsAre("step_000002"));
}

TEST_F(TrainDashboardTest, ThePageAndTheSamples) {
  httplib::Result page = client_->Get("/");
  ASSERT_EQ(page->status, 200);
  EXPECT_THAT(page->body, HasSubstr("<title>dray train</title>"));
  httplib::Result sample = client_->Get("/samples/step_10.png");
  ASSERT_EQ(sample->status, 200);
  EXPECT_EQ(sample->body, "a later one");
  EXPECT_EQ(sample->get_header_value("Content-Type"), "image/png");
  EXPECT_EQ(client_->Get("/samples/step_3.png")->status, 404);
  EXPECT_EQ(client_->Get("/samples/notes.txt")->status, 404);
  EXPECT_EQ(client_->Get("/samples/..%2fconfig.yaml")->status, 404);
}

TEST_F(TrainDashboardTest, MetricsAreTheNewestStepsForPrometheus) {
  httplib::Result result = client_->Get("/metrics");
  ASSERT_EQ(result->status, 200);
  for (const char* sample :
       {"dray_train_step 2", "dray_train_total_steps 8", "dray_train_reward_mean 0.5",
        "dray_train_reward_target_psnr 0.5", "dray_train_loss 0.25",
        "dray_train_rollout_seconds 1.25", "dray_train_images_per_second 3",
        "dray_train_restarts_total 1", "# TYPE dray_train_restarts_total counter"}) {
    EXPECT_THAT(result->body, HasSubstr(sample));
  }
  EXPECT_THAT(result->body, Not(HasSubstr("\ndray_train_rollout_s ")));
}

}  // namespace
}  // namespace dray
