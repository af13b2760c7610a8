#include "tests/edit/edit_test_util.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "tests/runtime/test_util.h"
#include "workers/image/image_codec.h"
#include "workers/models/qwen_image/edit_pipeline.h"
#include "workers/models/qwen_image/model.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {

namespace {

std::string WriteTinyModel(const char* name, qwen_image::EditPipelineKind pipeline) {
  const std::string path = (std::filesystem::path(std::getenv("TEST_TMPDIR")) / name).string();
  qwen_image::ModelPreset preset = qwen_image::PresetNamed("tiny").value();
  preset.pipeline = pipeline;
  if (!qwen_image::WriteRandomQwenImageModel(path, preset, 0).ok()) std::abort();
  return path;
}

}  // namespace

std::string TinyModelDir(qwen_image::EditPipelineKind pipeline) {
  if (pipeline == qwen_image::EditPipelineKind::kEditPlus) {
    static const std::string plus = WriteTinyModel("tiny_plus", pipeline);
    return plus;
  }
  static const std::string edit = WriteTinyModel("tiny", pipeline);
  return edit;
}

ImageEditConfig TestConfig(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {absl::StrCat("worker.image_edit.model_path=", TinyModelDir()),
                                  "worker.image_edit.image_size=64",
                                  "worker.image_edit.num_inference_steps=2",
                                  "worker.image_edit.batch_size=2"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  return ImageEditConfig::Load("", all).value();
}

absl::StatusOr<std::unique_ptr<ImageEditController>> StartTestController(
    const ImageEditConfig& config, int workers, ImageEditController::Options options) {
  options.workers = workers;
  options.worker_command = {RunfilePath("cli/dray"), "worker"};
  return ImageEditController::Start(config, options);
}

std::string EncodeTestImage(const at::Tensor& rgb) { return EncodePng(rgb).value(); }

TestBatch MakeTestBatch(int n) {
  TestBatch batch;
  for (int i = 0; i < n; ++i) {
    const int64_t height = 24 + 8 * (i % 3), width = 40 + 8 * i;
    at::Tensor image =
        at::arange(height * width * 3, at::kLong).mul(i + 1).remainder(256).to(at::kByte);
    batch.pngs.push_back(EncodeTestImage(image.view({height, width, 3})));
    batch.instructions.push_back(
        absl::StrCat("make the sky ", i % 2 ? "green" : "purple", " number ", i));
  }
  batch.data = MakeEditBatch(batch.pngs, batch.instructions).value();
  return batch;
}

std::vector<at::Tensor> EditInProcess(const ImageEditConfig& config, const TestBatch& batch) {
  qwen_image::QwenImageEditPipeline pipeline(
      qwen_image::LoadQwenImageModel(config.model_path, at::TensorOptions().dtype(at::kFloat))
          .value());
  const qwen_image::EditOptions options = EditOptionsFor(config, {}).value();
  std::vector<at::Tensor> edited;
  for (size_t i = 0; i < batch.pngs.size(); ++i) {
    const qwen_image::EditInput input{{DecodeImage(batch.pngs[i].view()).value()},
                                      batch.instructions[i],
                                      static_cast<uint64_t>(config.seed) + i};
    edited.push_back(pipeline.Edit({input}, options).value().front());
  }
  return edited;
}

std::vector<at::Tensor> EditedImages(const DataProto& edited) {
  std::vector<at::Tensor> images;
  for (const Image& image : *edited.GetRows<Image>(kEditedColumn).value()) {
    images.push_back(DecodeImage(image.bytes.view()).value());
  }
  return images;
}

}  // namespace dray
