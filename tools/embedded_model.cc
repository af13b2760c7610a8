// embedded_model: packs a trained embedded-preset model directory into the
// embedded model's weights file, unpacks such a file into a model directory
// (workers/models/qwen_image/embedded_model.h), or scores a model directory
// on the synthetic edits of held-out scenes (workers/train/synthetic_edit_score.h).
//
//   bazel run //tools:embedded_model -- pack --model DIR --out FILE.safetensors
//   bazel run //tools:embedded_model -- unpack --weights FILE.safetensors --out DIR
//   bazel run //tools:embedded_model -- score [--model DIR] [--height 48 --width 80]
//       [--steps 4] [--lora FILE] [--guidance 4] [--grid FILE.png]   (no --model: the embedded
//       model)
//   bazel run //tools:embedded_model -- compare --lora FILE --steps 4 --teacher-steps 20
//       --teacher-guidance 4 [--grid FILE.png]   (a distilled generator against its teacher)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/status_macros.h"
#include "workers/image/image_codec.h"
#include "workers/models/lora.h"
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

// Scoring: what `score` scores: a model directory (empty: the embedded
// model), with a LoRA file's adapters if named, in `steps` denoising steps
// (0: the embedded model's).
struct Scoring {
  std::string model_dir;
  std::string lora;
  int steps = 0;
  double guidance = 1;  // true CFG's scale with the negative prompt " " (1: none)
};

// ModelDir: `model_dir`, or the embedded model written into `scratch`.
absl::StatusOr<std::string> ModelDir(const std::string& model_dir,
                                     std::optional<dray::ScratchDir>& scratch) {
  if (!model_dir.empty()) return model_dir;
  DRAY_ASSIGN_OR_RETURN(scratch, dray::ScratchDir::Create("dray-embedded"));
  DRAY_RETURN_IF_ERROR(dray::qwen_image::WriteEmbeddedModel(scratch->path() + "/model"));
  return scratch->path() + "/model";
}

// Scored: `scoring`'s model's scores on `scenes`, and the seconds their
// edits took (the faster of two runs: the machine may be busy).
struct Scored {
  std::vector<dray::SyntheticEditScore> scores;
  double seconds = 0;
};
absl::StatusOr<Scored> Score(const Scoring& scoring, const dray::HeldOutScenes& scenes) {
  std::optional<dray::ScratchDir> scratch;
  DRAY_ASSIGN_OR_RETURN(std::string model_dir, ModelDir(scoring.model_dir, scratch));
  DRAY_ASSIGN_OR_RETURN(
      dray::qwen_image::QwenImageModel model,
      dray::qwen_image::LoadQwenImageModel(model_dir, at::TensorOptions(at::kFloat)));
  if (!scoring.lora.empty())
    DRAY_RETURN_IF_ERROR(dray::LoadLoraAdapters(*model.transformer, scoring.lora).status());
  dray::qwen_image::QwenImageEditPipeline pipeline(std::move(model));
  Scored scored;
  for (int run = 0; run < 2; ++run) {
    const absl::Time started = absl::Now();
    DRAY_ASSIGN_OR_RETURN(
        scored.scores,
        dray::ScoreSyntheticEdits(pipeline, scenes, {}, scoring.steps, scoring.guidance));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - started);
    scored.seconds = run == 0 ? seconds : std::min(scored.seconds, seconds);
  }
  return scored;
}

// MeanRemaining: the scores' mean share of the distance left.
double MeanRemaining(const std::vector<dray::SyntheticEditScore>& scores) {
  double sum = 0;
  for (const dray::SyntheticEditScore& score : scores) sum += score.remaining;
  return sum / static_cast<double>(scores.size());
}

// PsnrTo: the PSNR (dB) of every edit in `scores` against the same edit in `reference`.
double PsnrTo(const std::vector<dray::SyntheticEditScore>& scores,
              const std::vector<dray::SyntheticEditScore>& reference) {
  double squared = 0;
  int64_t count = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t s = 0; s < scores[i].edited.size(); ++s) {
      const at::Tensor a = scores[i].edited[s].to(at::kDouble);
      squared += (a - reference[i].edited[s].to(at::kDouble)).pow(2).sum().item<double>();
      count += a.numel();
    }
  }
  return 10 * std::log10(255.0 * 255.0 / (squared / static_cast<double>(count)));
}

// Comparison: a distilled generator (`student`: its LoRA and steps, no
// guidance) against its teacher (the model without it, `teacher_steps`
// steps guided at `teacher_guidance`) and the model undistilled at the
// student's steps, unguided and guided.
struct Comparison {
  Scoring student;
  int teacher_steps = 20;
  double teacher_guidance = 4;
};

// PrintComparison prints each setting's transformer passes per edit, edit
// score, PSNR to the teacher's edits and seconds per edit (measured here,
// one after another), and draws the edits of three instructions side by
// side into `grid`, if named.
absl::Status PrintComparison(const Comparison& c, const dray::HeldOutScenes& scenes,
                             const std::string& grid) {
  const Scoring undistilled{c.student.model_dir, "", c.student.steps, 1};
  const Scoring guided{c.student.model_dir, "", c.student.steps, c.teacher_guidance};
  const Scoring teacher{c.student.model_dir, "", c.teacher_steps, c.teacher_guidance};
  const auto steps = [](int n) { return absl::StrCat(n, n == 1 ? " step" : " steps"); };
  const std::vector<std::pair<std::string, Scoring>> settings = {
      {absl::StrCat("teacher, ", steps(c.teacher_steps), ", CFG ", c.teacher_guidance), teacher},
      {absl::StrCat("undistilled, ", steps(c.student.steps)), undistilled},
      {absl::StrCat("undistilled, ", steps(c.student.steps), ", CFG ", c.teacher_guidance), guided},
      {absl::StrCat("DMD2, ", steps(c.student.steps)), c.student}};
  std::vector<Scored> results;
  for (const auto& [name, scoring] : settings) {
    DRAY_ASSIGN_OR_RETURN(results.emplace_back(), Score(scoring, scenes));
  }
  const int64_t edits = static_cast<int64_t>(results[0].scores.size()) * scenes.count;
  std::printf("%-32s %8s %12s %16s %12s\n", "", "passes", "edit score", "PSNR to teacher",
              "s per edit");
  for (size_t i = 0; i < settings.size(); ++i) {
    const Scoring& s = settings[i].second;
    const std::string psnr =
        i == 0 ? "-" : absl::StrFormat("%.2f dB", PsnrTo(results[i].scores, results[0].scores));
    std::printf("%-32s %8d %12.3f %16s %12.4f\n", settings[i].first.c_str(),
                s.steps * (s.guidance > 1 ? 2 : 1), MeanRemaining(results[i].scores), psnr.c_str(),
                results[i].seconds / static_cast<double>(edits));
  }
  std::printf("(edit score: the share of the distance to the exact edit's mean colour left)\n");
  if (grid.empty()) return absl::OkStatus();
  // The grid's font has lower-case letters and digits.
  const std::vector<std::string> captions = {
      absl::StrCat("teacher ", c.teacher_steps), absl::StrCat(c.student.steps, " steps"),
      absl::StrCat(c.student.steps, " steps cfg"), absl::StrCat("dmd2 ", c.student.steps)};
  std::vector<dray::SampleRow> rows;
  for (const char* instruction : {"make it red", "turn the sky orange", "make it darker"}) {
    for (int64_t s = 0; s < std::min<int64_t>(2, scenes.count); ++s) {
      dray::SampleRow& row = rows.emplace_back();
      row.inputs = {dray::SyntheticScene(s, scenes.height, scenes.width)};
      for (size_t i = 0; i < settings.size(); ++i) {
        for (const dray::SyntheticEditScore& score : results[i].scores) {
          if (score.instruction != instruction) continue;
          row.outputs.push_back(score.edited[s]);
          row.captions.push_back(captions[i]);
        }
      }
    }
  }
  return dray::WritePngFile(grid, dray::SampleGrid(rows, /*cell=*/120));
}

// PrintScores scores a model (and draws its edits into `grid`, if named).
absl::Status PrintScores(const Scoring& scoring, const dray::HeldOutScenes& scenes,
                         const std::string& grid) {
  DRAY_ASSIGN_OR_RETURN(Scored scored, Score(scoring, scenes));
  const std::vector<dray::SyntheticEditScore>& scores = scored.scores;
  for (const dray::SyntheticEditScore& score : scores)
    std::printf("%-22s %.3f\n", score.instruction.c_str(), score.remaining);
  std::printf("%-22s %.3f  (share of the distance to the exact edit's mean colour left)\n", "mean",
              MeanRemaining(scores));
  return grid.empty() ? absl::OkStatus() : WriteGrid(grid, scores, scenes);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Pack, unpack or score the embedded model's weights.");
  app.require_subcommand(1);
  std::string model, out, weights, grid;
  dray::HeldOutScenes scenes;
  Scoring scoring;
  CLI::App* pack = app.add_subcommand("pack", "pack a model directory's trained weights");
  pack->add_option("--model", model, "an embedded-preset model directory")->required();
  pack->add_option("--out", out, "the weights file to write")->required();
  CLI::App* unpack = app.add_subcommand("unpack", "write a model directory from packed weights");
  unpack->add_option("--weights", weights, "a packed weights file")->required();
  unpack->add_option("--out", out, "the model directory to write")->required();
  CLI::App* score = app.add_subcommand("score", "score a model on held-out synthetic scenes");
  score->add_option("--model", scoring.model_dir,
                    "a model directory (default: the embedded model)");
  score->add_option("--lora", scoring.lora, "a LoRA file for the transformer (dray train's)");
  score->add_option("--steps", scoring.steps, "denoising steps (default: the embedded model's)")
      ->check(CLI::Range(1, 1000));
  score->add_option("--guidance", scoring.guidance,
                    "true CFG's scale, with the negative prompt \" \" (default 1: none)");
  score->add_option("--scenes", scenes.count, "how many scenes")->check(CLI::Range(1, 64));
  score->add_option("--height", scenes.height, "the scenes' height")->check(CLI::Range(16, 512));
  score->add_option("--width", scenes.width, "the scenes' width")->check(CLI::Range(16, 512));
  score->add_option("--grid", grid, "a PNG to draw the scenes and their edits into");
  Comparison comparison;
  CLI::App* compare = app.add_subcommand("compare",
                                         "compare a distilled generator (dray train's DMD2 LoRA) "
                                         "with its teacher on held-out synthetic scenes");
  compare->add_option("--model", comparison.student.model_dir,
                      "the teacher's model directory (default: the embedded model)");
  compare->add_option("--lora", comparison.student.lora, "the generator's LoRA file")->required();
  compare->add_option("--steps", comparison.student.steps, "the generator's steps")
      ->check(CLI::Range(1, 1000))
      ->required();
  compare->add_option("--teacher-steps", comparison.teacher_steps, "the teacher's steps")
      ->check(CLI::Range(1, 1000));
  compare->add_option("--teacher-guidance", comparison.teacher_guidance,
                      "the teacher's true CFG scale, negative prompt \" \"");
  compare->add_option("--grid", grid, "a PNG to draw three instructions' edits side by side into");
  CLI11_PARSE(app, argc, argv);
  absl::Status done;
  if (pack->parsed()) {
    done = dray::qwen_image::PackModelWeights(model, out);
  } else if (unpack->parsed()) {
    done = dray::qwen_image::WriteModelWithPackedWeights(out, weights);
  } else if (compare->parsed()) {
    done = PrintComparison(comparison, scenes, grid);
  } else {
    done = PrintScores(scoring, scenes, grid);
  }
  if (!done.ok()) {
    std::fprintf(stderr, "embedded_model: %s\n", done.ToString().c_str());
    return 1;
  }
  if (pack->parsed() || unpack->parsed()) std::printf("wrote %s\n", out.c_str());
  return 0;
}
