// synthetic_edit_pairs: writes the synthetic paired edit set the embedded
// model is trained on (scenes with every synthetic instruction's target,
// and two-picture rows giving a scene another's sky,
// workers/train/train_data.h) as train.jsonl and PNG files.
//
//   bazel run //tools:synthetic_edit_pairs -- --out /tmp/pairs --scenes 512
//       --first-seed 1000 [--sizes 64x64,48x80] [--sky-donors 4]
//
// --sizes: HEIGHTxWIDTH, taken in turn by the scenes (default 64x64).
// --sky-donors: two-picture rows per scene (default 0).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "workers/train/train_data.h"

namespace {

// ParseSize reads "HEIGHTxWIDTH" (multiples of 16, 16 to 1024).
std::string ParseSize(const std::string& text, dray::ImageSize& size) {
  const std::vector<std::string> parts = absl::StrSplit(text, 'x');
  for (size_t i = 0; i < 2; ++i) {
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[i], &size[i]) || size[i] < 16 ||
        size[i] > 1024 || size[i] % 16 != 0)
      return "a size is HEIGHTxWIDTH, each a multiple of 16 from 16 to 1024, not '" + text + "'";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Write synthetic edit pairs ({image, instruction, target} rows).");
  std::string out;
  int64_t scenes = 512, first_seed = 1000, sky_donors = 0;
  app.add_option("--out", out, "the directory to write (created)")->required();
  app.add_option("--scenes", scenes, "how many scenes (each with every instruction)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--first-seed", first_seed, "the first scene's seed (scenes are consecutive)");
  app.add_option("--sky-donors", sky_donors,
                 "two-picture rows per scene (\"give picture 1 the sky of picture 2\")")
      ->check(CLI::NonNegativeNumber);
  std::vector<dray::ImageSize> sizes;
  app.add_option_function<std::vector<std::string>>(
         "--sizes",
         [&](const std::vector<std::string>& texts) {
           for (const std::string& text : texts) {
             const std::string error = ParseSize(text, sizes.emplace_back());
             if (!error.empty()) throw CLI::ValidationError("--sizes", error);
           }
         },
         "the scenes' sizes, HEIGHTxWIDTH, taken in turn (default 64x64)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  if (sizes.empty()) sizes.push_back({64, 64});
  std::error_code error;
  std::filesystem::create_directories(out, error);
  absl::StatusOr<std::string> written =
      error ? absl::PermissionDeniedError(error.message())
            : dray::WriteSyntheticEditPairs(out, scenes, first_seed, sizes, sky_donors);
  if (!written.ok()) {
    std::fprintf(stderr, "synthetic_edit_pairs: %s: %s\n", out.c_str(),
                 written.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", written->c_str());
  return 0;
}
