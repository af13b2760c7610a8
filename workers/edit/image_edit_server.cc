#include "workers/edit/image_edit_server.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <functional>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "base/log.h"
#include "base/request_id.h"
#include "base/status_macros.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "runtime/security/tls.h"
#include "workers/pipeline/edit_batch.h"

namespace dray {
namespace {

// How often a waiting handler asks gRPC whether its client has gone (the
// synchronous API has no cancellation event), and health its workers.
// Progress and results wake handlers at once.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

// QueuedEdit: one image waiting for, or in, a batch.
struct QueuedEdit {
  MetaInfo options;           // the worker call's meta info: requests batch together when equal
  std::vector<Bytes> images;  // its pictures
  std::string instruction;
  int64_t seed = 0;
  absl::Time enqueued;
  absl::Time deadline;
  std::atomic<bool> abandoned{false};  // the client has gone

  // Progress records its batch's denoising progress.
  void Progress(int64_t done, int64_t total) {
    absl::MutexLock lock(&mu);
    step = done;
    steps = total;
  }
  // Finish records the outcome; later outcomes are ignored.
  void Finish(absl::StatusOr<v1::EditImageResponse> outcome) {
    absl::MutexLock lock(&mu);
    if (!result.has_value()) result = std::move(outcome);
  }

  absl::Mutex mu;
  int64_t step ABSL_GUARDED_BY(mu) = 0;
  int64_t steps ABSL_GUARDED_BY(mu) = 0;
  std::optional<absl::StatusOr<v1::EditImageResponse>> result ABSL_GUARDED_BY(mu);
};
using QueuedEdits = std::vector<std::shared_ptr<QueuedEdit>>;

absl::Time DeadlineOf(const grpc::ServerContext& context) {
  const auto deadline = context.deadline();
  if (deadline >= std::chrono::system_clock::now() + std::chrono::hours(24 * 365))
    return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

// RequestIdOf: the caller's request id when it is 16 hex digits, else a new one.
std::string RequestIdOf(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto sent = metadata.find(kRequestIdMetadata);
  if (sent != metadata.end()) {
    const absl::string_view id(sent->second.data(), sent->second.size());
    if (id.size() == 16 && absl::c_all_of(id, absl::ascii_isxdigit)) return std::string(id);
  }
  return NewRequestId();
}

}  // namespace

class ImageEditServer::Impl final : public v1::ImageEditService::Service {
 public:
  Impl(EditBackend* backend, ServeOptions options)
      : backend_(backend),
        options_(std::move(options)),
        max_rows_(backend->config().batch_size * backend->workers()),
        metrics_(backend) {}
  ~Impl() override { Shutdown(); }

  absl::Status Start();
  void Drain(absl::Duration grace);
  void Shutdown();
  int port() const { return port_; }
  ServeMetrics& metrics() { return metrics_; }
  std::shared_ptr<grpc::Channel> InProcessChannel() {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);  // the answer to n rows holds n images
    return server_->InProcessChannel(args);
  }

  grpc::Status Edit(grpc::ServerContext* context, const v1::EditImageRequest* request,
                    v1::EditImageResponse* response) override {
    return Answer(context, "Edit", [&]() -> absl::Status {
      DRAY_ASSIGN_OR_RETURN(QueuedEdits queued, Admit({request}, *context));
      DRAY_ASSIGN_OR_RETURN(*response, Await(queued.front(), *context));
      return absl::OkStatus();
    });
  }

  grpc::Status EditBatch(grpc::ServerContext* context, const v1::EditImageBatchRequest* request,
                         v1::EditImageBatchResponse* response) override {
    return Answer(context, "EditBatch", [&] { return EditAll(*request, *context, response); });
  }

  grpc::Status EditStream(grpc::ServerContext* context, const v1::EditImageRequest* request,
                          grpc::ServerWriter<v1::EditImageEvent>* writer) override {
    return Answer(context, "EditStream", [&]() -> absl::Status {
      DRAY_ASSIGN_OR_RETURN(QueuedEdits queued, Admit({request}, *context));
      v1::EditImageEvent event;
      DRAY_ASSIGN_OR_RETURN(*event.mutable_result(),
                            Await(queued.front(), *context, [&](int64_t step, int64_t steps) {
                              event.mutable_progress()->set_step(step);
                              event.mutable_progress()->set_steps(steps);
                              writer->Write(event);
                            }));
      writer->Write(event);
      return absl::OkStatus();
    });
  }

 private:
  // Answer handles one request under its request id (the caller's, when it
  // sends a well-formed one, else a new one), which its client finds in the
  // initial metadata (kRequestIdMetadata) and at the end of an error's
  // message; errors are logged with it.
  grpc::Status Answer(grpc::ServerContext* context, absl::string_view method,
                      const std::function<absl::Status()>& handle);
  absl::Status EditAll(const v1::EditImageBatchRequest& request, const grpc::ServerContext& context,
                       v1::EditImageBatchResponse* response);
  // Admit checks the requests and queues them all, or none.
  absl::StatusOr<QueuedEdits> Admit(const std::vector<const v1::EditImageRequest*>& requests,
                                    const grpc::ServerContext& context);
  absl::StatusOr<std::shared_ptr<QueuedEdit>> Prepare(const v1::EditImageRequest& request,
                                                      int64_t row, absl::Time deadline) const;
  // Await waits for `edit`'s result while its client waits, passing new
  // denoising progress to `on_progress` (when given).
  absl::StatusOr<v1::EditImageResponse> Await(
      const std::shared_ptr<QueuedEdit>& edit, const grpc::ServerContext& context,
      const std::function<void(int64_t step, int64_t steps)>& on_progress = nullptr);
  // NextBatch blocks for the next batch (empty when every request it took
  // was abandoned); nullopt when shutting down.
  std::optional<QueuedEdits> NextBatch();
  // Abandon marks `edit` as no longer awaited; when no client awaits the
  // running batch any more, the backend stops it.
  void Abandon(QueuedEdit& edit);
  void RunBatch(const QueuedEdits& batch);
  void RunBatches();
  void WatchHealth();
  // UpdateHealth sets the served health from the backend's and draining_.
  void UpdateHealth(bool backend_healthy);
  void SetServing(bool serving);

  EditBackend* const backend_;
  const ServeOptions options_;
  const int64_t max_rows_;
  ServeMetrics metrics_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::thread batcher_, health_watcher_;
  absl::Notification stopped_;

  absl::Mutex mu_;
  std::deque<std::shared_ptr<QueuedEdit>> queue_ ABSL_GUARDED_BY(mu_);
  QueuedEdits running_batch_ ABSL_GUARDED_BY(mu_);  // the batch with the backend
  bool draining_ ABSL_GUARDED_BY(mu_) = false;      // admitting nothing new
  bool serving_ ABSL_GUARDED_BY(mu_) = true;        // what health says
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::Status ImageEditServer::Impl::Answer(grpc::ServerContext* context, absl::string_view method,
                                           const std::function<absl::Status()>& handle) {
  const absl::Time start = absl::Now();
  const std::string id = RequestIdOf(*context);
  context->AddInitialMetadata(kRequestIdMetadata, id);
  absl::Status status = options_.bearer_token.empty()
                            ? absl::OkStatus()
                            : CheckBearerToken(*context, options_.bearer_token);
  if (status.ok()) status = handle();
  metrics_.Request("grpc", std::string(method), absl::StatusCodeToString(status.code()),
                   absl::Now() - start);
  if (status.ok()) return grpc::Status::OK;
  Log("serve", absl::StrCat("request ", id, " (", method, "): ", status.ToString()));
  return ToGrpcStatus(
      absl::Status(status.code(), absl::StrCat(status.message(), " [request ", id, "]")));
}

absl::Status ImageEditServer::Impl::EditAll(const v1::EditImageBatchRequest& request,
                                            const grpc::ServerContext& context,
                                            v1::EditImageBatchResponse* response) {
  std::vector<const v1::EditImageRequest*> requests;
  for (const v1::EditImageRequest& one : request.requests()) requests.push_back(&one);
  DRAY_ASSIGN_OR_RETURN(QueuedEdits queued, Admit(requests, context));
  for (const std::shared_ptr<QueuedEdit>& edit : queued) {
    absl::StatusOr<v1::EditImageResponse> result = Await(edit, context);
    if (!result.ok()) {
      for (const auto& other : queued) Abandon(*other);
      return result.status();
    }
    *response->add_responses() = *std::move(result);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<QueuedEdit>> ImageEditServer::Impl::Prepare(
    const v1::EditImageRequest& request, int64_t row, absl::Time deadline) const {
  const ImageEditConfig& config = backend_->config();
  if (request.more_images_size() > kMaxPictures - 1) {
    return absl::InvalidArgumentError(absl::StrCat("row ", row, ": more_images holds ",
                                                   request.more_images_size(), " images; at most ",
                                                   kMaxPictures - 1));
  }
  auto edit = std::make_shared<QueuedEdit>();
  edit->images.push_back(Bytes(request.image()));
  for (const std::string& image : request.more_images()) edit->images.push_back(Bytes(image));
  for (size_t p = 0; p < edit->images.size(); ++p) {
    if (static_cast<int64_t>(edit->images[p].size()) > options_.max_image_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "row ", row, ": ", p == 0 ? "the image" : absl::StrCat("picture ", p + 1), " has ",
          edit->images[p].size(), " bytes; at most ", options_.max_image_bytes, " are accepted"));
    }
  }
  edit->instruction = request.instruction();
  edit->seed = request.has_seed() ? request.seed() : config.seed;
  edit->deadline = deadline;
  edit->options = {{"num_inference_steps",
                    int64_t{request.has_num_inference_steps() ? request.num_inference_steps()
                                                              : config.num_inference_steps}},
                   {"true_cfg_scale", request.has_true_cfg_scale() ? request.true_cfg_scale()
                                                                   : config.true_cfg_scale},
                   {"negative_prompt", request.has_negative_prompt() ? request.negative_prompt()
                                                                     : config.negative_prompt},
                   {"guidance_scale", request.has_guidance_scale() ? request.guidance_scale()
                                                                   : config.guidance_scale},
                   {"width", int64_t{request.width()}},
                   {"height", int64_t{request.height()}}};
  DRAY_ASSIGN_OR_RETURN(DataProto row_batch,
                        MakeEditBatch(std::vector<std::vector<Bytes>>{edit->images},
                                      {edit->instruction}, {edit->seed}));
  for (const auto& [key, value] : edit->options) row_batch.SetMeta(key, value);
  DRAY_RETURN_IF_ERROR(backend_->CheckRows(row_batch, row));
  return edit;
}

absl::StatusOr<QueuedEdits> ImageEditServer::Impl::Admit(
    const std::vector<const v1::EditImageRequest*>& requests, const grpc::ServerContext& context) {
  if (absl::Status health = backend_->Health(); !health.ok()) {
    UpdateHealth(false);  // now: a client told UNAVAILABLE must not be told SERVING after
    return health;
  }
  if (requests.empty()) return QueuedEdits();
  if (requests.size() > static_cast<size_t>(options_.max_queue)) {
    return absl::InvalidArgumentError(
        absl::StrCat(requests.size(), " images in one request; the queue holds at most ",
                     options_.max_queue, ", so send at most that many"));
  }
  QueuedEdits edits;
  const absl::Time deadline = DeadlineOf(context);
  for (size_t i = 0; i < requests.size(); ++i) {
    DRAY_ASSIGN_OR_RETURN(std::shared_ptr<QueuedEdit> edit,
                          Prepare(*requests[i], static_cast<int64_t>(i), deadline));
    edits.push_back(std::move(edit));
  }
  absl::MutexLock lock(&mu_);
  if (draining_ || shutting_down_) return absl::UnavailableError("the server is shutting down");
  if (queue_.size() + edits.size() > static_cast<size_t>(options_.max_queue)) {
    return absl::ResourceExhaustedError(absl::StrCat("the queue holds ", queue_.size(),
                                                     " of at most ", options_.max_queue,
                                                     " images; retry later"));
  }
  const absl::Time now = absl::Now();
  for (const auto& edit : edits) {
    edit->enqueued = now;
    queue_.push_back(edit);
  }
  metrics_.QueueImages(static_cast<int64_t>(queue_.size()));
  return edits;
}

absl::StatusOr<v1::EditImageResponse> ImageEditServer::Impl::Await(
    const std::shared_ptr<QueuedEdit>& edit, const grpc::ServerContext& context,
    const std::function<void(int64_t step, int64_t steps)>& on_progress) {
  int64_t reported = 0;
  while (true) {
    int64_t step, steps;
    std::optional<absl::StatusOr<v1::EditImageResponse>> result;
    {
      absl::MutexLock lock(&edit->mu);
      auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(edit->mu) {
        return edit->result.has_value() || edit->step > reported;
      };
      edit->mu.AwaitWithDeadline(absl::Condition(&changed),
                                 std::min(edit->deadline, absl::Now() + kPollInterval));
      step = edit->step;
      steps = edit->steps;
      result = edit->result;
    }
    // Progress frames precede results on the workers' streams: the last
    // step is in before the result.
    if (step > reported) {
      reported = step;
      if (on_progress) on_progress(step, steps);
    }
    if (result.has_value()) return *std::move(result);
    if (absl::Now() >= edit->deadline) {
      Abandon(*edit);
      return absl::DeadlineExceededError("the deadline passed before the image was edited");
    }
    if (context.IsCancelled()) {
      Abandon(*edit);
      return absl::CancelledError("the client cancelled the request");
    }
  }
}

void ImageEditServer::Impl::Abandon(QueuedEdit& edit) {
  edit.abandoned = true;
  absl::MutexLock lock(&mu_);  // the running batch stays the same meanwhile
  if (running_batch_.empty()) return;
  for (const auto& running : running_batch_) {
    if (!running->abandoned) return;
  }
  backend_->CancelRunning(absl::CancelledError("every client of the batch has gone"));
}

std::optional<QueuedEdits> ImageEditServer::Impl::NextBatch() {
  absl::MutexLock lock(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutting_down_ || !queue_.empty(); };
  mu_.Await(absl::Condition(&ready));
  if (shutting_down_) return std::nullopt;
  const MetaInfo options = queue_.front()->options;
  auto full = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t rows = 0;
    for (const auto& edit : queue_) rows += edit->options == options;
    return shutting_down_ || rows >= max_rows_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&full), queue_.front()->enqueued + options_.max_wait);
  QueuedEdits batch;
  for (auto it = queue_.begin();
       it != queue_.end() && static_cast<int64_t>(batch.size()) < max_rows_;) {
    if ((*it)->options != options) {
      ++it;
      continue;
    }
    if (!(*it)->abandoned) batch.push_back(*it);
    it = queue_.erase(it);
  }
  running_batch_ = batch;
  metrics_.QueueImages(static_cast<int64_t>(queue_.size()));
  return batch;
}

void ImageEditServer::Impl::RunBatch(const QueuedEdits& batch) {
  std::vector<std::vector<Bytes>> images;
  std::vector<std::string> instructions;
  std::vector<int64_t> seeds;
  absl::Time deadline = absl::InfinitePast();
  for (const auto& edit : batch) {
    images.push_back(edit->images);
    instructions.push_back(edit->instruction);
    seeds.push_back(edit->seed);
    deadline = std::max(deadline, edit->deadline);
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<DataProto> edited = [&]() -> absl::StatusOr<DataProto> {
    DRAY_ASSIGN_OR_RETURN(DataProto input, MakeEditBatch(images, instructions, seeds));
    for (const auto& [key, value] : batch.front()->options) input.SetMeta(key, value);
    std::optional<absl::Duration> timeout;
    if (deadline != absl::InfiniteFuture())
      timeout = std::max(deadline - absl::Now(), absl::ZeroDuration());
    return backend_->EditCheckedRows(  // Prepare checked each row (CheckRows)
        input, timeout, [&batch](int64_t step, int64_t steps) {
          for (const auto& edit : batch) edit->Progress(step, steps);
        });
  }();
  const std::vector<Image>* rows = nullptr;
  if (edited.ok()) {
    absl::StatusOr<const std::vector<Image>*> column = edited->GetRows<Image>(kEditedColumn);
    if (column.ok())
      rows = *column;
    else
      edited = column.status();
  }
  metrics_.Batch(static_cast<int64_t>(batch.size()), absl::Now() - start, edited.ok());
  for (size_t i = 0; i < batch.size(); ++i) {
    QueuedEdit& edit = *batch[i];
    if (!edited.ok()) {
      edit.Finish(edited.status());
    } else {
      v1::EditImageResponse response;
      const Image& image = (*rows)[i];
      response.set_image(std::string(image.bytes.view()));
      response.set_width(image.width);
      response.set_height(image.height);
      response.set_seed(edit.seed);
      response.set_batch_rows(static_cast<int32_t>(batch.size()));
      edit.Finish(std::move(response));
    }
  }
}

void ImageEditServer::Impl::RunBatches() {
  while (std::optional<QueuedEdits> batch = NextBatch()) {
    if (batch->empty()) continue;
    RunBatch(*batch);
    absl::MutexLock lock(&mu_);
    running_batch_.clear();
  }
}

void ImageEditServer::Impl::WatchHealth() {
  while (!stopped_.WaitForNotificationWithTimeout(kPollInterval)) {
    UpdateHealth(backend_->Health().ok());
  }
}

void ImageEditServer::Impl::UpdateHealth(bool backend_healthy) {
  absl::MutexLock lock(&mu_);  // Drain's NOT_SERVING is never overwritten
  const bool healthy = backend_healthy && !draining_;
  if (healthy == serving_) return;
  serving_ = healthy;
  SetServing(serving_);
}

void ImageEditServer::Impl::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  health->SetServingStatus(kImageEditServiceName, serving);
  health->SetServingStatus(serving);
}

void ImageEditServer::Impl::Drain(absl::Duration grace) {
  if (server_ == nullptr) return;
  bool idle;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    serving_ = false;
    SetServing(false);
    auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || (queue_.empty() && running_batch_.empty());
    };
    idle = mu_.AwaitWithTimeout(absl::Condition(&done), grace);
  }
  if (!idle) {
    backend_->CancelAll(absl::UnavailableError(
        absl::StrCat("the server is shutting down: the request was cancelled after the ",
                     absl::FormatDuration(grace), " grace period")));
  }
  Shutdown();
}

absl::Status ImageEditServer::Impl::Start() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(
      options_.address,
      options_.credentials != nullptr ? options_.credentials : DrayServerCredentials(), &port_);
  ConfigureKeepalive(&builder);
  ExplainUnparsableRequests(&builder);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::min<int64_t>(2 * options_.max_image_bytes + (1 << 20), INT32_MAX)));
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve on ", options_.address, " (in use, or not an address)"));
  }
  server_->GetHealthCheckService()->SetServingStatus(kImageEditServiceName, true);
  batcher_ = std::thread([this] { RunBatches(); });
  health_watcher_ = std::thread([this] { WatchHealth(); });
  return absl::OkStatus();
}

void ImageEditServer::Impl::Shutdown() {
  if (server_ == nullptr || stopped_.HasBeenNotified()) return;
  std::deque<std::shared_ptr<QueuedEdit>> left;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    left.swap(queue_);
  }
  stopped_.Notify();
  for (const auto& edit : left) edit->Finish(absl::UnavailableError("the server is shutting down"));
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  if (batcher_.joinable()) batcher_.join();
  if (health_watcher_.joinable()) health_watcher_.join();
}

ImageEditServer::ImageEditServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ImageEditServer::~ImageEditServer() { impl_->Shutdown(); }

absl::StatusOr<std::unique_ptr<ImageEditServer>> ImageEditServer::Start(EditBackend* backend,
                                                                        ServeOptions options) {
  auto impl = std::make_unique<Impl>(backend, std::move(options));
  DRAY_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<ImageEditServer>(new ImageEditServer(std::move(impl)));
}

int ImageEditServer::port() const { return impl_->port(); }

std::shared_ptr<grpc::Channel> ImageEditServer::InProcessChannel() {
  return impl_->InProcessChannel();
}

ServeMetrics& ImageEditServer::metrics() { return impl_->metrics(); }

void ImageEditServer::Shutdown() { impl_->Shutdown(); }

void ImageEditServer::Drain(absl::Duration grace) { impl_->Drain(grace); }

}  // namespace dray
