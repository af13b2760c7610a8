// Shared pieces of the image-edit tests: the tiny model, a fast test
// configuration, controllers of real `dray worker` processes, test images,
// and the same edits run in this process for comparison.
#ifndef DRAY_TESTS_EDIT_EDIT_TEST_UTIL_H_
#define DRAY_TESTS_EDIT_EDIT_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "dispatch/data_proto.h"
#include "workers/edit/image_edit_controller.h"
#include "workers/models/qwen_image/model.h"
#include "workers/pipeline/edit_config.h"

namespace dray {

// TinyModelDir writes the tiny model (made for `pipeline`) once per test
// binary and returns its folder.
std::string TinyModelDir(
    qwen_image::EditPipelineKind pipeline = qwen_image::EditPipelineKind::kEdit);

// TestConfig: the tiny model at 64^2 with 2 steps (guidance on), plus `overrides`.
ImageEditConfig TestConfig(const std::vector<std::string>& overrides = {});

// StartTestController starts `workers` real worker processes (`dray worker`)
// with `options` (its workers and worker_command set here).
absl::StatusOr<std::unique_ptr<ImageEditController>> StartTestController(
    const ImageEditConfig& config, int workers, ImageEditController::Options options = {});

// TestBatch: `n` distinct PNG images of different sizes, and instructions.
struct TestBatch {
  std::vector<Bytes> pngs;
  std::vector<std::string> instructions;
  DataProto data;  // MakeEditBatch(pngs, instructions)
};
TestBatch MakeTestBatch(int n);

std::string EncodeTestImage(const at::Tensor& rgb);

// EditInProcess edits each row of `batch` alone here, with the seed a worker
// gives row i (config.seed + i).
std::vector<at::Tensor> EditInProcess(const ImageEditConfig& config, const TestBatch& batch);

// EditedImages decodes the final_edited_images column.
std::vector<at::Tensor> EditedImages(const DataProto& edited);

}  // namespace dray

#endif  // DRAY_TESTS_EDIT_EDIT_TEST_UTIL_H_
