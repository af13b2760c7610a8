// Runs `dray bench --quick --json` as a user would and checks that it prints
// every figure each suite promises, each a positive number with a
// unit. Values are not judged here: benchmarks measure, tests do not time.
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "base/libtorch_compat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

// RunBench runs `dray bench ARGS` and returns its JSON figures by name.
std::map<std::string, double> RunBench(const std::string& args) {
  FILE* bench = popen(absl::StrCat(RunfilePath("cli/dray"), " bench ", args).c_str(), "r");
  EXPECT_NE(bench, nullptr);
  std::map<std::string, double> figures;
  const std::regex line(
      R"re(\{"name": "([a-z0-9_]+)", "value": ([-0-9.e+]+), "unit": "([^"]+)"\}\n)re");
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), bench) != nullptr) {
    std::cmatch match;
    EXPECT_TRUE(std::regex_match(buffer, match, line)) << "not a JSON figure: " << buffer;
    if (!match.empty()) figures[match[1]] = std::stod(match[2]);
  }
  EXPECT_EQ(pclose(bench), 0);
  return figures;
}

TEST(BenchCliTest, PrintsEveryRuntimeFigureAsJson) {
  std::map<std::string, double> figures = RunBench("--workers 2 --quick --json");
  for (const char* name : {"grpc_echo_p50_us",
                           "call_sync_p50_us",
                           "call_sync_p99_us",
                           "call_sync_p50_vs_grpc_echo",
                           "calls_async_per_s",
                           "one_to_all_p50_us_w1",
                           "one_to_all_p50_us_w2",
                           "one_to_all_p50_us_w4",
                           "one_to_all_p50_us_w8",
                           "loopback_tcp_gbps",
                           "dp_compute_proto_gbps",
                           "dp_compute_proto_vs_loopback",
                           "call_sync_tcp_p50_us",
                           "dp_compute_proto_tcp_gbps",
                           "dp_compute_proto_tcp_vs_loopback",
                           "memcpy_gbps",
                           "dp_compute_proto_vs_memcpy",
                           "one_to_all_64mib_ms_w1",
                           "one_to_all_64mib_ms_w8",
                           "one_to_all_64mib_w8_vs_w1",
                           "one_to_all_p50_us_w64",
                           "dispatch_skew_ms_w64"}) {
    ASSERT_EQ(figures.count(name), 1u) << name;
    EXPECT_TRUE(std::isfinite(figures[name]) && figures[name] > 0)
        << name << " = " << figures[name];
  }
}

TEST(BenchCliTest, TheServiceUnderLoadFailsNothingAndLeavesNoWorker) {
  const std::map<std::string, double> figures = RunBench("--suite serve --quick --json");
  for (const char* name :
       {"serve_capacity_per_s", "serve_2x_p50_ms", "serve_2x_p99_ms", "serve_2x_answered",
        "serve_half_p50_ms", "serve_half_p99_ms", "serve_half_answered", "serve_peak_rss_start_mib",
        "serve_peak_rss_end_mib"}) {
    ASSERT_EQ(figures.count(name), 1u) << name;
    EXPECT_GT(figures.at(name), 0) << name;
  }
  for (const char* name : {"serve_2x_exhausted", "serve_half_exhausted"}) {
    ASSERT_EQ(figures.count(name), 1u) << name;  // how many depends on timing: not judged
  }
  EXPECT_EQ(figures.at("serve_failures"), 0);
  EXPECT_EQ(figures.at("serve_workers_left"), 0);
}

TEST(BenchCliTest, PrintsEveryShardingFigure) {
  const std::map<std::string, double> figures = RunBench("--suite sharding --quick --json");
  for (int world : {1, 2, 4}) {
    for (const char* name : {"shard_param_bytes_w", "shard_ideal_bytes_w", "shard_grad_bytes_w",
                             "shard_optimizer_bytes_w", "shard_step_ratio_w"}) {
      const std::string figure = absl::StrCat(name, world);
      ASSERT_EQ(figures.count(figure), 1u) << figure;
      EXPECT_GT(figures.at(figure), 0) << figure;
    }
  }
  // Memory falls with the world size (values are bytes, not timings).
  EXPECT_LT(figures.at("shard_param_bytes_w4"), figures.at("shard_param_bytes_w2"));
  EXPECT_LT(figures.at("shard_param_bytes_w2"), figures.at("shard_param_bytes_w1"));
  // DMD2's three models hold what their parameter counts predict, within
  // the shards' padding.
  for (int world : {1, 2, 4}) {
    for (const char* name : {"dmd2_generator_bytes_w", "dmd2_real_score_bytes_w",
                             "dmd2_fake_score_bytes_w", "dmd2_predicted_bytes_w"})
      EXPECT_GT(figures.at(absl::StrCat(name, world)), 0) << name << world;
    EXPECT_NEAR(figures.at(absl::StrCat("dmd2_measured_over_predicted_w", world)), 1.0, 0.01);
  }
}

TEST(BenchCliTest, PrintsEveryEditFigure) {
  const std::map<std::string, double> figures = RunBench("--suite edit --quick --json");
  for (const char* name : {"edit_images_per_s_w1",
                           "edit_images_per_s_w2",
                           "edit_speedup_w2",
                           "edit_mixed_shapes_slowdown_w1",
                           "edit_direct_p50_ms",
                           "edit_served_p50_ms",
                           "serve_overhead_ms",
                           "matmul_gflops",
                           "attention_gflops",
                           "attention_matmul_share",
                           "attention_training_slowdown",
                           "step_ms_256",
                           "step_ms_512",
                           "edit_single_ms_w1",
                           "edit_step_ms_w1",
                           "edit_single_ms_cfg2",
                           "edit_cfg2_speedup",
                           "edit_cfg2_step_speedup",
                           "edit_cfg2_vs_all_cores",
                           "edit_ulysses2_speedup",
                           "edit_ulysses2_step_speedup",
                           "edit_cfg2_ulysses2_step_speedup",
                           "edit_ulysses4_step_speedup",
                           "edit_512_ulysses2_speedup",
                           "edit_512_ulysses2_step_speedup",
                           "edit_score_exact",
                           "edit_step_cache020_speedup",
                           "edit_step_cache020_psnr_db",
                           "edit_step_cache020_reused_share",
                           "edit_step_cache020_edit_score"}) {
    ASSERT_EQ(figures.count(name), 1u) << name;
    EXPECT_TRUE(std::isfinite(figures.at(name))) << name;
  }
  EXPECT_GT(figures.at("edit_images_per_s_w1"), 0);
}

TEST(BenchCliTest, PrintsEveryTrainFigureAndDrawsTheAlgorithms) {
  const std::string plot = absl::StrCat(std::getenv("TEST_TMPDIR"), "/algorithms.png");
  const std::map<std::string, double> figures =
      RunBench("--suite train --quick --json --plot " + plot);
  for (int workers : {1, 2}) {
    for (const char* figure : {"train_step_s", "train_rollout_s", "train_reward_s",
                               "train_update_s", "train_images_per_s", "train_controller_share"}) {
      const std::string name = absl::StrCat(figure, "_w", workers);
      ASSERT_EQ(figures.count(name), 1u) << name;
      EXPECT_TRUE(std::isfinite(figures.at(name))) << name;
    }
  }
  EXPECT_GT(figures.at("train_images_per_s_w1"), 0);
  EXPECT_TRUE(figures.count("train_speedup_w2"));
  EXPECT_GT(figures.at("train_step_s_async"), 0);
  EXPECT_TRUE(figures.count("train_async_speedup_w2"));
  for (const char* algorithm :
       {"grpo", "flow_grpo_fast", "grpo_guard", "mix_grpo", "dance_grpo", "diffusion_nft", "dpo"}) {
    for (const char* figure : {"_images_per_s", "_reward_first", "_reward_last"}) {
      const std::string name = absl::StrCat("train_", algorithm, figure);
      ASSERT_EQ(figures.count(name), 1u) << name;
      EXPECT_GT(figures.at(name), 0) << name;
    }
  }
  absl::StatusOr<std::string> png = ReadFile(plot);
  ASSERT_TRUE(png.ok()) << png.status();
  EXPECT_EQ(png->substr(1, 3), "PNG");
}

TEST(BenchCliTest, PrintsEveryGpuFigureOnTheCpuWithoutADevice) {
  const std::map<std::string, double> figures = RunBench("--suite gpu --quick --json");
  std::vector<std::string> names = {"block_forward_ms",
                                    "block_forward_tflops",
                                    "block_forward_backward_ms",
                                    "block_forward_backward_tflops",
                                    "step_s",
                                    "step_peak_memory_gib"};
  if (kHasFusedAttention) {
    names.insert(names.end(), {"block_forward_blockwise_ms", "fused_attention_speedup"});
  }
  for (const std::string& name : names) {
    ASSERT_EQ(figures.count(name), 1u) << name;
    EXPECT_TRUE(std::isfinite(figures.at(name)) && figures.at(name) > 0) << name;
  }
  EXPECT_EQ(figures.count("block_forward_peak_share"), 0u);  // a CPU has no bf16 peak here
}

TEST(BenchCliTest, PrintsAPlanRatioPerCase) {
  const std::map<std::string, double> figures = RunBench("--suite plan --quick --json");
  int ratios = 0;
  for (const auto& [name, value] : figures) {
    if (name.rfind("plan_ratio_", 0) != 0) continue;
    ++ratios;
    EXPECT_GT(value, 0) << name;  // judged by workers/bench:plan_bench_test
    const std::string case_name = name.substr(std::string("plan_ratio_").size());
    EXPECT_EQ(figures.count("plan_measured_" + case_name), 1u) << case_name;
    EXPECT_EQ(figures.count("plan_predicted_" + case_name), 1u) << case_name;
  }
  EXPECT_EQ(ratios, 16);  // W 1 and 2, two strategies, LoRA or full, checkpointing or not
}

TEST(BenchCliTest, RejectsAnUnknownSuite) {
  EXPECT_NE(
      std::system(absl::StrCat(RunfilePath("cli/dray"), " bench --suite nope 2>/dev/null").c_str()),
      0);
}

}  // namespace
}  // namespace dray
