// embedded_model: packs a trained embedded-preset model directory into the
// embedded model's weights file, unpacks such a file into a model directory
// (workers/models/qwen_image/embedded_model.h), or scores a model directory
// on the synthetic edits of held-out scenes (workers/train/synthetic_edit_score.h).
//
//   bazel run //tools:embedded_model -- pack --model DIR --out FILE.safetensors
//   bazel run //tools:embedded_model -- unpack --weights FILE.safetensors --out DIR
//   bazel run //tools:embedded_model -- score --model DIR [--height 48 --width 80] [--grid
//   FILE.png]
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/embedded_model.h"
#include "workers/models/qwen_image/model.h"
#include "workers/train/plot.h"
#include "workers/train/synthetic_edit_score.h"
#include "workers/train/train_data.h"

namespace {

// WriteGrid writes each scene, then its edits, a row each (the two-picture
// edit after its picture 2).
absl::Status WriteGrid(const std::string& path, const std::vector<dray::SyntheticEditScore>& scores,
                       const dray::HeldOutScenes& scenes) {
  std::vector<dray::SampleRow> rows;
  for (int64_t s = 0; s < scenes.count; ++s) {
    dray::SampleRow& row = rows.emplace_back();
    row.inputs = {dray::SyntheticScene(s, scenes.height, scenes.width)};
    for (const dray::SyntheticEditScore& score : scores) {
      const bool two_pictures = score.instruction == dray::kSkyTransferInstruction;
      if (two_pictures) {
        row.outputs.push_back(dray::SkyDonorScene(dray::HeldOutScenes::kFirstSkyDonor + s,
                                                  scenes.height, scenes.width));
        row.captions.push_back("picture 2");
      }
      row.outputs.push_back(score.edited[s]);
      row.captions.push_back(two_pictures ? "1 with sky of 2" : score.instruction);
    }
  }
  return dray::WritePngFile(path, dray::SampleGrid(rows, /*cell=*/120));
}

// PrintScores scores the model directory `model_dir` (and draws its edits
// into `grid`, if named).
absl::Status PrintScores(const std::string& model_dir, const dray::HeldOutScenes& scenes,
                         const std::string& grid) {
  DRAY_ASSIGN_OR_RETURN(
      dray::qwen_image::QwenImageModel model,
      dray::qwen_image::LoadQwenImageModel(model_dir, at::TensorOptions(at::kFloat)));
  dray::qwen_image::QwenImageEditPipeline pipeline(std::move(model));
  DRAY_ASSIGN_OR_RETURN(std::vector<dray::SyntheticEditScore> scores,
                        dray::ScoreSyntheticEdits(pipeline, scenes));
  double sum = 0;
  for (const dray::SyntheticEditScore& score : scores) {
    std::printf("%-22s %.3f\n", score.instruction.c_str(), score.remaining);
    sum += score.remaining;
  }
  std::printf("%-22s %.3f  (share of the distance to the exact edit's mean colour left)\n", "mean",
              sum / scores.size());
  return grid.empty() ? absl::OkStatus() : WriteGrid(grid, scores, scenes);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Pack, unpack or score the embedded model's weights.");
  app.require_subcommand(1);
  std::string model, out, weights, grid;
  dray::HeldOutScenes scenes;
  CLI::App* pack = app.add_subcommand("pack", "pack a model directory's trained weights");
  pack->add_option("--model", model, "an embedded-preset model directory")->required();
  pack->add_option("--out", out, "the weights file to write")->required();
  CLI::App* unpack = app.add_subcommand("unpack", "write a model directory from packed weights");
  unpack->add_option("--weights", weights, "a packed weights file")->required();
  unpack->add_option("--out", out, "the model directory to write")->required();
  CLI::App* score = app.add_subcommand("score", "score a model on held-out synthetic scenes");
  score->add_option("--model", model, "a model directory")->required();
  score->add_option("--scenes", scenes.count, "how many scenes")->check(CLI::Range(1, 64));
  score->add_option("--height", scenes.height, "the scenes' height")->check(CLI::Range(16, 512));
  score->add_option("--width", scenes.width, "the scenes' width")->check(CLI::Range(16, 512));
  score->add_option("--grid", grid, "a PNG to draw the scenes and their edits into");
  CLI11_PARSE(app, argc, argv);
  absl::Status done;
  if (pack->parsed()) {
    done = dray::qwen_image::PackModelWeights(model, out);
  } else if (unpack->parsed()) {
    done = dray::qwen_image::WriteModelWithPackedWeights(out, weights);
  } else {
    done = PrintScores(model, scenes, grid);
  }
  if (!done.ok()) {
    std::fprintf(stderr, "embedded_model: %s\n", done.ToString().c_str());
    return 1;
  }
  if (!score->parsed()) std::printf("wrote %s\n", out.c_str());
  return 0;
}
