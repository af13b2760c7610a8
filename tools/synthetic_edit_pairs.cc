// synthetic_edit_pairs: writes the synthetic paired edit set the embedded
// model is trained on (scenes with every synthetic instruction's target,
// workers/train/train_data.h) as train.jsonl and PNG files.
//
//   bazel run //tools:synthetic_edit_pairs -- --out /tmp/pairs --scenes 512 --first-seed 1000
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "workers/train/train_data.h"

int main(int argc, char** argv) {
  CLI::App app("Write synthetic edit pairs ({image, instruction, target} rows).");
  std::string out;
  int64_t scenes = 512, first_seed = 1000;
  app.add_option("--out", out, "the directory to write (created)")->required();
  app.add_option("--scenes", scenes, "how many scenes (each with every instruction)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--first-seed", first_seed, "the first scene's seed (scenes are consecutive)");
  CLI11_PARSE(app, argc, argv);
  std::error_code error;
  std::filesystem::create_directories(out, error);
  absl::StatusOr<std::string> written =
      error ? absl::PermissionDeniedError(error.message())
            : dray::WriteSyntheticEditPairs(out, scenes, first_seed);
  if (!written.ok()) {
    std::fprintf(stderr, "synthetic_edit_pairs: %s: %s\n", out.c_str(),
                 written.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", written->c_str());
  return 0;
}
