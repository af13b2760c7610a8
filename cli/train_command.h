// `dray train`: the command-line face of Flow-GRPO training (workers/train/).
//
//   dray train [--config FILE] [SECTION.KEY=VALUE ...] [--workers N]
//
// With no data.train_files it runs the embedded task on the embedded tiny
// model. The resolved configuration is printed at start and saved to
// trainer.save_dir, with metrics.jsonl, curves.png, samples/ and final/.
#ifndef DRAY_CLI_TRAIN_COMMAND_H_
#define DRAY_CLI_TRAIN_COMMAND_H_

#include <memory>
#include <optional>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace dray {

class TrainCommand {
 public:
  // Adds the subcommand to `app`; `self` is this executable, which workers
  // run as `self worker`.
  TrainCommand(CLI::App& app, std::string self);
  ~TrainCommand();

  // Run trains when the subcommand was chosen and returns its exit code;
  // nullopt otherwise.
  std::optional<int> Run();

  struct Flags;  // defined in train_command.cc

 private:
  std::unique_ptr<Flags> flags_;
};

}  // namespace dray

#endif  // DRAY_CLI_TRAIN_COMMAND_H_
