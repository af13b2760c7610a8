// `dray edit` and `dray serve`: the command-line faces of the image-edit
// worker (workers/edit/).
//
//   dray edit --image IN --instruction TEXT --out OUT [--server HOST:PORT]
//             [--config FILE] [worker.image_edit.KEY=VALUE ...] [options]
//   dray serve [--config FILE] [worker.image_edit.KEY=VALUE ...] [--workers N] [--port P]
#ifndef DRAY_CLI_EDIT_COMMANDS_H_
#define DRAY_CLI_EDIT_COMMANDS_H_

#include <memory>
#include <optional>
#include <string>

namespace CLI {
class App;
}  // namespace CLI

namespace dray {

class EditCommands {
 public:
  // Adds both subcommands to `app`; `self` is this executable, which
  // workers run as `self worker`.
  EditCommands(CLI::App& app, std::string self);
  ~EditCommands();

  // Run runs the subcommand chosen and returns its exit code; nullopt when
  // neither was chosen.
  std::optional<int> Run();

  struct Flags;  // defined in edit_commands.cc

 private:
  std::unique_ptr<Flags> flags_;
};

}  // namespace dray

#endif  // DRAY_CLI_EDIT_COMMANDS_H_
