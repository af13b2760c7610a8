// EditBackend: what ImageEditServer needs of whatever edits its batches: the
// configuration, the number of workers (to size batches), their health, and
// the edit call itself with its progress, and what metrics report. ImageEditController is the real
// one; unit tests of the server's admission and batching use a fake.
//
// Thread-safety: implementations are thread-safe.
#ifndef DRAY_WORKERS_EDIT_EDIT_BACKEND_H_
#define DRAY_WORKERS_EDIT_EDIT_BACKEND_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dispatch/data_proto.h"
#include "runtime/controller/rank_memory.h"
#include "workers/pipeline/edit_config.h"

namespace dray {

class EditBackend {
 public:
  // ProgressCallback receives a call's denoising progress (steps done, of
  // all the call will run): keep it short.
  using ProgressCallback = std::function<void(int64_t step, int64_t steps)>;

  virtual ~EditBackend() = default;

  virtual const ImageEditConfig& config() const = 0;
  // workers: how many share each call's rows: workers, or the groups of
  // workers that compute one edit together (CFG in parallel, Ulysses).
  virtual int workers() const = 0;
  // Health is OK while every worker runs; UNAVAILABLE naming one that does not.
  virtual absl::Status Health() const = 0;
  // restarts: how many times the workers have been restarted.
  virtual int restarts() const = 0;
  // WorkerMemory: each rank's memory as it answered its last call.
  virtual std::vector<RankMemory> WorkerMemory() const = 0;

  // CancelRunning asks the calls in flight to stop early (they fail with
  // `why`); it does not wait, and later calls run as usual.
  virtual void CancelRunning(const absl::Status& why) = 0;

  // CancelAll stops every call in flight now, for good (they fail with
  // `why`), and no call runs after it: the end of a graceful shutdown.
  virtual void CancelAll(const absl::Status& why) = 0;

  // CheckRows is admission: CheckEditBatch with the backend's configuration
  // and tokenizer. Rows count from `first_row`.
  virtual absl::Status CheckRows(const DataProto& batch, int64_t first_row) const = 0;

  // EditCheckedRows edits rows that passed CheckRows and returns
  // final_edited_images in row order. `timeout` unset: the backend's own.
  virtual absl::StatusOr<DataProto> EditCheckedRows(const DataProto& batch,
                                                    std::optional<absl::Duration> timeout,
                                                    const ProgressCallback& on_progress) = 0;
};

}  // namespace dray

#endif  // DRAY_WORKERS_EDIT_EDIT_BACKEND_H_
