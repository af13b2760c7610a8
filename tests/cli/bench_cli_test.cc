// Runs `dray bench --quick --json` as a user would and checks that it prints
// every figure the runtime benchmark promises, each a positive number with a
// unit. Values are not judged here: benchmarks measure, tests do not time.
#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/test_util.h"

namespace dray {
namespace {

TEST(BenchCliTest, PrintsEveryRuntimeFigureAsJson) {
  FILE* bench = popen(absl::StrCat(RunfilePath("cli/dray"), " bench --workers 2 --quick --json").c_str(), "r");
  ASSERT_NE(bench, nullptr);
  std::map<std::string, double> figures;
  const std::regex line(R"re(\{"name": "([a-z0-9_]+)", "value": ([-0-9.e+]+), "unit": "([^"]+)"\}\n)re");
  char buffer[512];
  while (fgets(buffer, sizeof(buffer), bench) != nullptr) {
    std::cmatch match;
    ASSERT_TRUE(std::regex_match(buffer, match, line)) << "not a JSON figure: " << buffer;
    figures[match[1]] = std::stod(match[2]);
  }
  ASSERT_EQ(pclose(bench), 0);
  for (const char* name :
       {"grpc_echo_p50_us", "call_sync_p50_us", "call_sync_p99_us", "call_sync_p50_vs_grpc_echo",
        "calls_async_per_s", "one_to_all_p50_us_w1", "one_to_all_p50_us_w2", "one_to_all_p50_us_w4",
        "one_to_all_p50_us_w8", "loopback_tcp_gbps", "dp_compute_proto_gbps",
        "dp_compute_proto_vs_loopback"}) {
    ASSERT_EQ(figures.count(name), 1u) << name;
    EXPECT_TRUE(std::isfinite(figures[name]) && figures[name] > 0) << name << " = " << figures[name];
  }
}

TEST(BenchCliTest, RejectsAnUnknownSuite) {
  EXPECT_NE(std::system(absl::StrCat(RunfilePath("cli/dray"), " bench --suite nope 2>/dev/null").c_str()), 0);
}

}  // namespace
}  // namespace dray
