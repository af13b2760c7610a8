// embedded_model: packs a trained tiny-preset model directory into the
// embedded model's weights file, or unpacks such a file into a model
// directory (workers/models/qwen_image/embedded_model.h).
//
//   bazel run //tools:embedded_model -- pack --model DIR --out FILE.safetensors
//   bazel run //tools:embedded_model -- unpack --weights FILE.safetensors --out DIR
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "workers/models/qwen_image/embedded_model.h"

int main(int argc, char** argv) {
  CLI::App app("Pack or unpack the embedded model's weights.");
  app.require_subcommand(1);
  std::string model, out, weights;
  CLI::App* pack = app.add_subcommand("pack", "pack a model directory's trained weights");
  pack->add_option("--model", model, "a tiny-preset model directory")->required();
  pack->add_option("--out", out, "the weights file to write")->required();
  CLI::App* unpack = app.add_subcommand("unpack", "write a model directory from packed weights");
  unpack->add_option("--weights", weights, "a packed weights file")->required();
  unpack->add_option("--out", out, "the model directory to write")->required();
  CLI11_PARSE(app, argc, argv);
  const absl::Status done = pack->parsed()
                                ? dray::qwen_image::PackModelWeights(model, out)
                                : dray::qwen_image::WriteModelWithPackedWeights(out, weights);
  if (!done.ok()) {
    std::fprintf(stderr, "embedded_model: %s\n", done.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
