#include "cli/edit_commands.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/client_context.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "base/files.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "base/stop_signals.h"
#include "cli/cluster_commands.h"
#include "dray/v1/image_edit.grpc.pb.h"
#include "runtime/rpc/grpc_util.h"
#include "runtime/security/job_secret.h"
#include "runtime/security/tls.h"
#include "workers/edit/http_gateway.h"
#include "workers/edit/image_edit_controller.h"
#include "workers/edit/image_edit_server.h"
#include "workers/pipeline/edit_batch.h"
#include "workers/pipeline/edit_config.h"

namespace dray {

struct EditCommands::Flags {
  std::string self;
  CLI::App* edit = nullptr;
  CLI::App* serve = nullptr;
  // Both: the configuration.
  std::string config_file;
  std::vector<std::string> overrides;
  int workers = 1;
  std::optional<int64_t> cfg_parallel_size, ulysses_degree;  // one edit over several ranks
  std::optional<double> step_cache_threshold;
  // dray edit.
  std::vector<std::string> images;  // picture 1, 2, ...
  std::string instruction, out, server, model, lora, negative_prompt;
  std::optional<int64_t> steps, image_size, seed, width, height;
  std::optional<double> true_cfg_scale;
  std::optional<double> guidance_scale;
  double timeout_s = 600;
  std::string token_file;  // the bearer token presented to --server
  TlsFlags tls;            // to reach a --server on TLS
  // dray serve.
  std::string host = "127.0.0.1";  // this machine only, unless --host says otherwise
  int port = 8000;
  int max_queue = 64;
  int max_wait_ms = 20;
  double shutdown_grace_s = 10;
  int max_restarts = 3;
  std::string client_token_file;                // the bearer token clients must present
  std::string public_tls_cert, public_tls_key;  // ImageEditService's own certificate
  std::optional<int> http_port;                 // unset: no HTTP
  int http_max_connections = 64;
  int64_t http_max_body_mb = 64;
  ClusterFlags cluster;
};

namespace {

int Fail(const char* command, const absl::Status& status) {
  Log(command, status.ToString());
  return 1;
}

// Override spells one configuration key as a command-line override; the
// value is JSON, which YAML reads back exactly (quotes, colons and all).
std::string Override(const char* key, const nlohmann::json& value) {
  return absl::StrCat("worker.image_edit.", key, "=", value.dump());
}

// ShowProgress shows denoising steps: on one line on a terminal, one line
// per step in a log.
void ShowProgress(int64_t step, int64_t steps) {
  static const bool terminal = isatty(fileno(stderr));
  std::fprintf(stderr, "%sdenoising: step %lld/%lld%s", terminal ? "\r" : "",
               static_cast<long long>(step), static_cast<long long>(steps),
               !terminal || step == steps ? "\n" : "");
  std::fflush(stderr);
}

// WithSpeedFlags: the overrides, then the flags that make one edit faster
// (spread over ranks, cached steps; both commands have them).
std::vector<std::string> WithSpeedFlags(const EditCommands::Flags& f) {
  std::vector<std::string> overrides = f.overrides;
  if (f.cfg_parallel_size) overrides.push_back(Override("cfg_parallel_size", *f.cfg_parallel_size));
  if (f.ulysses_degree) overrides.push_back(Override("ulysses_degree", *f.ulysses_degree));
  if (f.step_cache_threshold)
    overrides.push_back(Override("step_cache_threshold", *f.step_cache_threshold));
  return overrides;
}

// AddSpeedFlags adds the flags that make one edit faster to `command`.
void AddSpeedFlags(CLI::App* command, EditCommands::Flags& f) {
  command
      ->add_option("--cfg-parallel-size", f.cfg_parallel_size,
                   "2: each edit's prompt and negative-prompt passes on two workers at once "
                   "(cfg_parallel_size; needs guidance to pay; --workers a multiple of 2)")
      ->check(CLI::Range(1, 2));
  command
      ->add_option("--ulysses-degree", f.ulysses_degree,
                   "split each edit's image tokens over this many workers (ulysses_degree; "
                   "sequence parallelism, for large images; --workers a multiple of it)")
      ->check(CLI::Range(1, 64));
  command->add_option("--step-cache-threshold", f.step_cache_threshold,
                      "reuse the transformer's later blocks on steps whose first block changed "
                      "less than this (step_cache_threshold; e.g. 0.3; 0: exact)");
}

// ResolveEditConfig: the file, the overrides, then the shortcut flags.
absl::StatusOr<ImageEditConfig> ResolveEditConfig(const EditCommands::Flags& f) {
  std::vector<std::string> overrides = WithSpeedFlags(f);
  if (!f.model.empty()) overrides.push_back(Override("model_path", f.model));
  if (!f.lora.empty()) overrides.push_back(Override("lora_path", f.lora));
  if (f.steps) overrides.push_back(Override("num_inference_steps", *f.steps));
  if (f.image_size) overrides.push_back(Override("image_size", *f.image_size));
  if (f.true_cfg_scale) overrides.push_back(Override("true_cfg_scale", *f.true_cfg_scale));
  if (f.guidance_scale) overrides.push_back(Override("guidance_scale", *f.guidance_scale));
  if (f.edit->count("--negative-prompt") > 0)
    overrides.push_back(Override("negative_prompt", f.negative_prompt));
  if (f.seed) overrides.push_back(Override("seed", *f.seed));
  return ImageEditConfig::Load(f.config_file, overrides);
}

ImageEditController::Options ControllerOptions(const EditCommands::Flags& f, int nodes = 1,
                                               NodePool* pool = nullptr) {
  ImageEditController::Options options;
  options.workers = f.workers;
  options.nodes = nodes;
  options.node_pool = pool;
  options.worker_command = {f.self, "worker"};
  options.max_restarts = f.max_restarts;
  return options;
}

// ReadImages reads the --image files, picture 1 first.
absl::StatusOr<std::vector<Bytes>> ReadImages(const std::vector<std::string>& paths) {
  std::vector<Bytes> images;
  for (const std::string& path : paths) {
    DRAY_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    images.push_back(Bytes(std::move(bytes)));
  }
  return images;
}

int EditLocally(const EditCommands::Flags& f) {
  absl::StatusOr<ImageEditConfig> config = ResolveEditConfig(f);
  if (!config.ok()) return Fail("edit", config.status());
  absl::StatusOr<std::vector<Bytes>> images = ReadImages(f.images);
  if (!images.ok()) return Fail("edit", images.status());
  absl::StatusOr<DataProto> batch =
      MakeEditBatch(std::vector<std::vector<Bytes>>{*images}, {f.instruction}, {config->seed});
  if (!batch.ok()) return Fail("edit", batch.status());
  batch->SetMeta("width", f.width.value_or(0));
  batch->SetMeta("height", f.height.value_or(0));
  // Everything but the prompt's tokens, before any worker starts.
  absl::StatusOr<qwen_image::EditPipelineKind> kind = EditPipelineKindOf(*config);
  if (!kind.ok()) return Fail("edit", kind.status());
  absl::Status checked = CheckEditBatch(*batch, *config, *kind, /*count_tokens=*/nullptr);
  if (!checked.ok()) return Fail("edit", checked);
  std::fprintf(stderr, "%s", config->ToYaml().c_str());
  Log("edit",
      absl::StrFormat("model %s, %d picture%s, %d steps at %d^2, %s, seed %d, %d worker%s",
                      config->model_path.empty() ? "embedded (the default)" : config->model_path,
                      images->size(), images->size() == 1 ? "" : "s", config->num_inference_steps,
                      config->image_size, config->GuidanceSummary(config->family()), config->seed,
                      f.workers, f.workers == 1 ? "" : "s"));
  absl::StatusOr<std::unique_ptr<ImageEditController>> controller =
      ImageEditController::Start(*config, ControllerOptions(f));
  if (!controller.ok()) return Fail("edit", controller.status());
  absl::StatusOr<DataProto> edited = (*controller)->Edit(*batch, std::nullopt, ShowProgress);
  absl::StatusOr<const std::vector<Image>*> rows =
      edited.ok() ? edited->GetRows<Image>(kEditedColumn)
                  : absl::StatusOr<const std::vector<Image>*>(edited.status());
  if (!rows.ok()) return Fail("edit", rows.status());
  const Image& result = (*rows)->front();
  absl::Status written = WriteFile(f.out, result.bytes.view());
  if (!written.ok()) return Fail("edit", written);
  std::printf("wrote %s (%dx%d)\n", f.out.c_str(), result.width, result.height);
  if (config->step_cache_threshold > 0) {
    const absl::StatusOr<at::Tensor> passes = edited->GetTensor(kTransformerPassesColumn);
    const absl::StatusOr<at::Tensor> reused = edited->GetTensor(kReusedPassesColumn);
    if (passes.ok() && reused.ok()) {
      Log("edit", absl::StrFormat("step cache: %d of %d transformer passes reused the later blocks",
                                  reused->sum().item<int64_t>(), passes->sum().item<int64_t>()));
    }
  }
  return 0;
}

// ServerSideOption: the first option given of those only a server's own
// configuration sets (an override included), or empty.
std::string ServerSideOption(const EditCommands::Flags& f) {
  for (const char* name : {"--config", "--model", "--lora", "--image-size", "--workers",
                           "--cfg-parallel-size", "--ulysses-degree", "--step-cache-threshold"}) {
    if (f.edit->count(name) > 0) return name;
  }
  return f.overrides.empty() ? "" : f.overrides.front();
}

int EditOnServer(const EditCommands::Flags& f) {
  if (const std::string option = ServerSideOption(f); !option.empty()) {
    return Fail("edit", absl::InvalidArgumentError(absl::StrCat(
                            option,
                            ": with --server the server's configuration applies; per request "
                            "only --steps, --true-cfg-scale, --guidance-scale, --negative-prompt, "
                            "--seed, --width and --height can be set")));
  }
  absl::StatusOr<std::vector<Bytes>> images = ReadImages(f.images);
  if (!images.ok()) return Fail("edit", images.status());
  v1::EditImageRequest request;
  request.set_image(std::string((*images)[0].view()));
  for (size_t p = 1; p < images->size(); ++p)
    request.add_more_images(std::string((*images)[p].view()));
  request.set_instruction(f.instruction);
  if (f.steps) request.set_num_inference_steps(static_cast<int32_t>(*f.steps));
  if (f.true_cfg_scale) request.set_true_cfg_scale(*f.true_cfg_scale);
  if (f.guidance_scale) request.set_guidance_scale(*f.guidance_scale);
  if (f.edit->count("--negative-prompt") > 0) request.set_negative_prompt(f.negative_prompt);
  if (f.seed) request.set_seed(*f.seed);
  request.set_width(static_cast<int32_t>(f.width.value_or(0)));
  request.set_height(static_cast<int32_t>(f.height.value_or(0)));
  grpc::ClientContext context;
  SetDeadline(&context, absl::Seconds(f.timeout_s));
  if (!f.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(f.token_file);
    if (!token.ok()) return Fail("edit", token.status());
    AttachBearerToken(&context, *token);
  }
  if (absl::Status tls = f.tls.Apply(); !tls.ok()) return Fail("edit", tls);
  Log("edit", absl::StrFormat("sent to %s, waiting (deadline %.0f s)", f.server, f.timeout_s));
  std::unique_ptr<grpc::ClientReader<v1::EditImageEvent>> events =
      v1::ImageEditService::NewStub(CreateDrayChannel(f.server))->EditStream(&context, request);
  v1::EditImageEvent event;
  v1::EditImageResponse response;
  while (events->Read(&event)) {
    if (event.has_progress()) ShowProgress(event.progress().step(), event.progress().steps());
    if (event.has_result()) response = event.result();
  }
  const absl::Status status = ToAbslStatus(events->Finish(), f.server);
  if (!status.ok()) return Fail("edit", status);
  absl::Status written = WriteFile(f.out, response.image());
  if (!written.ok()) return Fail("edit", written);
  std::printf("wrote %s (%dx%d, seed %lld, edited in a batch of %d)\n", f.out.c_str(),
              response.width(), response.height(), static_cast<long long>(response.seed()),
              response.batch_rows());
  return 0;
}

// ServeUntilStopped serves until a stop signal, then drains: in-flight
// requests get --shutdown-grace-s to finish before they are cancelled, and a
// second signal exits at once. Returns the exit code: 1 when the workers
// failed for good (restarts used up), for a supervisor to notice.
int ServeUntilStopped(const EditCommands::Flags& f, ImageEditController& controller,
                      ImageEditServer& server) {
  int signal = 0;
  while ((signal = WaitForStopSignal(/*timeout_ms=*/200)) == 0) {
    if (controller.WaitUntilGivenUp(absl::ZeroDuration())) {
      Log("serve", absl::StrCat(controller.Health().message(), "; exiting"));
      server.Shutdown();
      return 1;
    }
  }
  std::printf(
      "dray serve: %s, stopping: in-flight requests have %gs to finish (%s again stops at once)\n",
      strsignal(signal), f.shutdown_grace_s, strsignal(signal));
  std::fflush(stdout);
  absl::Notification drained;
  std::thread drain([&] {
    server.Drain(absl::Seconds(f.shutdown_grace_s));
    drained.Notify();
  });
  while (!drained.HasBeenNotified()) {
    if (const int again = WaitForStopSignal(/*timeout_ms=*/100); again != 0) {
      std::printf("dray serve: %s again, exiting now\n", strsignal(again));
      std::fflush(stdout);
      std::_Exit(128 + again);  // the workers die with this process (PR_SET_PDEATHSIG)
    }
  }
  drain.join();
  std::printf("dray serve: stopped\n");
  return 0;
}

// GatewayOptions: the HTTP port's, with the gRPC port's host, token and
// certificate (its own, else the cluster's), and the service's metrics.
HttpOptions GatewayOptions(const EditCommands::Flags& f, const ImageEditConfig& config,
                           const ServeOptions& serve, ServeMetrics& metrics) {
  HttpOptions options;
  options.metrics = &metrics;
  options.address = absl::StrCat(f.host, ":", *f.http_port);
  if (!config.model_path.empty()) {  // its directory's name, as vLLM's served model name
    std::filesystem::path directory = std::filesystem::path(config.model_path).lexically_normal();
    if (!directory.has_filename()) directory = directory.parent_path();  // ".../name/"
    options.model_id = directory.filename();
  }
  options.bearer_token = serve.bearer_token;
  if (!f.public_tls_cert.empty()) {
    options.tls = {f.public_tls_cert, f.public_tls_key, "", false};
  } else if (!f.cluster.tls.cert.empty()) {
    options.tls = {f.cluster.tls.cert, f.cluster.tls.key, f.cluster.tls.ca, f.cluster.tls.mutual};
  }
  options.max_connections = f.http_max_connections;
  options.max_body_bytes = f.http_max_body_mb << 20;
  options.max_call_bytes = 2 * serve.max_image_bytes;  // what its gRPC port takes, less a margin
  return options;
}

int Serve(const EditCommands::Flags& f) {
  // Signals wait for WaitForStopSignal below; every thread started from here on inherits the mask.
  BlockStopSignals();
  ClusterConfig cluster_config;
  absl::StatusOr<ImageEditConfig> config =
      ImageEditConfig::Load(f.config_file, WithSpeedFlags(f), ClusterConfigKeys(cluster_config));
  if (!config.ok()) return Fail("serve", config.status());
  const ClusterFlags cluster = f.cluster.WithConfig(cluster_config);
  std::printf("%s", config->ToYaml().c_str());
  std::fflush(stdout);
  absl::StatusOr<std::unique_ptr<NodePool>> pool = cluster.StartPool();  // outlives the workers
  if (!pool.ok()) return Fail("serve", pool.status());
  absl::StatusOr<std::unique_ptr<ImageEditController>> controller =
      ImageEditController::Start(*config, ControllerOptions(f, cluster.nodes, pool->get()));
  if (!controller.ok()) return Fail("serve", controller.status());
  ServeOptions options;
  options.address = absl::StrCat(f.host, ":", f.port);
  options.max_queue = f.max_queue;
  options.max_wait = absl::Milliseconds(f.max_wait_ms);
  if (!f.client_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSecretFile(f.client_token_file);
    if (!token.ok()) return Fail("serve", token.status());
    options.bearer_token = *std::move(token);
  }
  if (!f.public_tls_cert.empty() || !f.public_tls_key.empty()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        PublicServerCredentials(f.public_tls_cert, f.public_tls_key);
    if (!credentials.ok()) return Fail("serve", credentials.status());
    options.credentials = *std::move(credentials);
  }
  absl::StatusOr<std::unique_ptr<ImageEditServer>> server =
      ImageEditServer::Start(controller->get(), options);
  if (!server.ok()) return Fail("serve", server.status());
  std::printf(
      "dray serve: ImageEditService on %s:%d with %s, up to %lld images per call; "
      "SIGINT or SIGTERM stops\n",
      f.host.c_str(), (*server)->port(), WorkerLayout(cluster, f.workers).c_str(),
      static_cast<long long>(config->batch_size * f.workers * cluster.nodes /
                             config->RanksPerEdit()));
  if (f.client_token_file.empty() && f.host != "127.0.0.1" && f.host != "localhost" &&
      f.host != "::1") {
    Log("serve",
        absl::StrFormat("warning: ImageEditService listens on %s without authentication: anyone "
                        "who can reach port %d can use the workers (see --client-token-file)",
                        f.host, (*server)->port()));
  }
  absl::StatusOr<std::unique_ptr<HttpGateway>> http;
  if (f.http_port.has_value()) {
    http = HttpGateway::Start((*server)->InProcessChannel(),
                              GatewayOptions(f, *config, options, (*server)->metrics()));
    if (!http.ok()) return Fail("serve", http.status());
    std::printf(
        "dray serve: HTTP on %s://%s:%d (OpenAI's POST /v1/images/edits, GET /v1/models, "
        "/health, /ready, /metrics; a page at /)\n",
        f.public_tls_cert.empty() && f.cluster.tls.cert.empty() ? "http" : "https", f.host.c_str(),
        (*http)->port());
  }
  std::fflush(stdout);
  return ServeUntilStopped(f, **controller, **server);
}

}  // namespace

EditCommands::EditCommands(CLI::App& app, std::string self) : flags_(std::make_unique<Flags>()) {
  Flags& f = *flags_;
  f.self = std::move(self);
  const char* overrides_help =
      "configuration overrides, worker.image_edit.KEY=VALUE (after --config)";

  f.edit = app.add_subcommand(
      "edit", "edit an image by an instruction with Qwen-Image-Edit or FLUX.1 Kontext");
  f.edit
      ->add_option("--image", f.images,
                   "input image (PNG or JPEG); repeated, pictures 1 to 3 for an Edit-Plus model "
                   "(Qwen-Image-Edit-2509/2511), the output at the last one's aspect ratio")
      ->required()
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  f.edit->add_option("--instruction", f.instruction, "what to change")->required();
  f.edit->add_option("--out", f.out, "output PNG")->required();
  f.edit->add_option("--server", f.server,
                     "a `dray serve` at HOST:PORT; default: start local workers");
  f.edit->add_option("--config", f.config_file, "a YAML file with a worker.image_edit section");
  f.edit->add_option("overrides", f.overrides, overrides_help);
  f.edit->add_option("--workers", f.workers, "local worker processes")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  f.edit->add_option("--model", f.model,
                     "a diffusers Qwen-Image-Edit or FLUX.1 Kontext directory (model_path; its "
                     "model_index.json names the pipeline); default: the embedded tiny model");
  f.edit->add_option("--lora", f.lora,
                     "a LoRA file for the transformer (lora_path), e.g. what dray train writes");
  f.edit->add_option("--steps", f.steps, "denoising steps (num_inference_steps)")
      ->check(CLI::Range(1, 1000));
  f.edit->add_option("--image-size", f.image_size,
                     "work at about this many pixels squared (image_size)");
  f.edit->add_option("--true-cfg-scale", f.true_cfg_scale, "guidance scale (true_cfg_scale)");
  f.edit->add_option("--guidance-scale", f.guidance_scale,
                     "FLUX.1 Kontext's embedded guidance (guidance_scale; default 3.5)");
  f.edit->add_option("--negative-prompt", f.negative_prompt,
                     "what to steer away from; \"\" turns guidance off");
  f.edit->add_option("--seed", f.seed, "noise seed: the same seed gives the same image");
  f.edit->add_option("--width", f.width,
                     "output width (default: the input's aspect ratio at image_size)");
  f.edit->add_option("--height", f.height, "output height");
  f.edit->add_option("--timeout", f.timeout_s, "seconds to wait for a server")
      ->capture_default_str();
  f.edit->add_option("--token-file", f.token_file,
                     "a file with the token a --server asks for (authorization: Bearer)");
  f.tls.Add(f.edit);
  AddSpeedFlags(f.edit, f);

  f.serve = app.add_subcommand("serve", "serve ImageEditService (gRPC) from local workers");
  f.serve->add_option("--config", f.config_file, "a YAML file with a worker.image_edit section");
  f.serve->add_option("overrides", f.overrides, overrides_help);
  f.serve->add_option("--workers", f.workers, "worker processes (one per GPU) on each node")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  f.cluster.Add(f.serve);
  AddSpeedFlags(f.serve, f);
  f.serve
      ->add_option("--host", f.host,
                   "address to listen on (0.0.0.0: every interface, without authentication)")
      ->capture_default_str();
  f.serve->add_option("--port", f.port, "port to listen on; 0 picks a free one")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  f.serve
      ->add_option("--max-queue", f.max_queue,
                   "images waiting at most; more get RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  f.serve
      ->add_option("--max-restarts", f.max_restarts,
                   "restarts of failed workers before dray serve exits with status 1")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  f.serve
      ->add_option("--shutdown-grace-s", f.shutdown_grace_s,
                   "on SIGTERM, how long in-flight requests may take before they are cancelled")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  f.serve->add_option("--max-wait-ms", f.max_wait_ms, "how long a batch waits to fill")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  f.serve->add_option("--client-token-file", f.client_token_file,
                      "a file with the token every client must present (authorization: Bearer); "
                      "default: none asked");
  f.serve->add_option("--public-tls-cert", f.public_tls_cert,
                      "ImageEditService's own certificate (PEM), naming the address clients "
                      "dial; clients show no certificate (default: the cluster's --tls-cert)");
  f.serve->add_option("--public-tls-key", f.public_tls_key,
                      "the private key of --public-tls-cert (PEM)");
  f.serve
      ->add_option("--http-port", f.http_port,
                   "also serve HTTP here (OpenAI's images API, health); 0 picks a free port; same "
                   "host, token and certificate as the gRPC port")
      ->check(CLI::Range(0, 65535));
  f.serve
      ->add_option("--http-max-connections", f.http_max_connections,
                   "HTTP connections served at once; more get 503 at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  f.serve
      ->add_option("--http-max-body-mb", f.http_max_body_mb,
                   "largest HTTP request body (MiB); larger get 413")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
}

EditCommands::~EditCommands() = default;

std::optional<int> EditCommands::Run() {
  if (*flags_->edit) return flags_->server.empty() ? EditLocally(*flags_) : EditOnServer(*flags_);
  if (*flags_->serve) return Serve(*flags_);
  return std::nullopt;
}

}  // namespace dray
