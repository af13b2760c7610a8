// An EditBackend without workers, for tests of what sits in front of one
// (ImageEditServer, HttpGateway), in milliseconds.
#ifndef DRAY_WORKERS_EDIT_FAKE_EDIT_BACKEND_H_
#define DRAY_WORKERS_EDIT_FAKE_EDIT_BACKEND_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "base/status_macros.h"
#include "workers/edit/edit_backend.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {

// FakeEditBackend answers every row with its own input image, after reporting
// two steps. While held (Hold), calls wait for Release or a CancelRunning,
// which ends them with its status.
class FakeEditBackend final : public EditBackend {
 public:
  explicit FakeEditBackend(int64_t batch_size) { config_.batch_size = batch_size; }

  const ImageEditConfig& config() const override { return config_; }
  int workers() const override { return 2; }
  void CancelRunning(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    cancel_ = why;
  }
  void CancelAll(const absl::Status&) override {}
  absl::Status CheckRows(const DataProto& batch, int64_t first_row) const override {
    return CheckEditBatch(batch, config_, qwen_image::EditPipelineKind::kEdit,
                          /*count_tokens=*/nullptr, first_row);
  }
  absl::Status Health() const override {
    absl::MutexLock lock(&mu_);
    return health_;
  }
  int restarts() const override { return 1; }
  std::vector<RankMemory> WorkerMemory() const override {
    return {{true, int64_t{300} << 20, 0}, {false, 0, 0}};  // rank 1 has not answered
  }
  absl::StatusOr<DataProto> EditCheckedRows(const DataProto& batch, std::optional<absl::Duration>,
                                            const ProgressCallback& on_progress) override {
    {
      absl::MutexLock lock(&mu_);
      call_rows_.push_back(batch.size());
      auto go = [this]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_ || cancel_.has_value(); };
      mu_.Await(absl::Condition(&go));
      if (held_) return *cancel_;
    }
    on_progress(1, 2);
    on_progress(2, 2);
    DRAY_ASSIGN_OR_RETURN(const std::vector<Image>* images, batch.GetRows<Image>(kImagesColumn));
    return DataProto::Make({}, {{kEditedColumn, *images}});
  }

  void set_health(absl::Status health) {
    absl::MutexLock lock(&mu_);
    health_ = std::move(health);
  }
  void Hold() {
    absl::MutexLock lock(&mu_);
    held_ = true;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    held_ = false;
    cancel_.reset();
  }
  // WaitForCalls returns once `calls` calls have begun.
  void WaitForCalls(size_t calls) {
    absl::MutexLock lock(&mu_);
    auto begun = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return call_rows_.size() >= calls; };
    mu_.Await(absl::Condition(&begun));
  }
  // WaitForCancel returns the status of the first CancelRunning since Release.
  absl::Status WaitForCancel() {
    absl::MutexLock lock(&mu_);
    auto cancelled = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancel_.has_value(); };
    mu_.Await(absl::Condition(&cancelled));
    return *cancel_;
  }
  std::vector<int64_t> call_rows() const {
    absl::MutexLock lock(&mu_);
    return call_rows_;
  }

 private:
  ImageEditConfig config_;
  mutable absl::Mutex mu_;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> cancel_ ABSL_GUARDED_BY(mu_);
  absl::Status health_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> call_rows_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_FAKE_EDIT_BACKEND_H_
