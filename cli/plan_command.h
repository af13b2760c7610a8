// `dray plan`: each rank's peak memory in a training step, before running
// it: the command-line face of workers/train/memory_plan.h.
//
//   dray plan --model flux-real --world-size 4 --activation-checkpointing --device-memory 24GiB
//   dray plan --config job.yaml worker.actor.lora_rank=0 --world-size 8 --json
//
// The model is a preset or a model directory, counted shape-only. The setup
// comes from a train config (--config and SECTION.KEY=VALUE overrides, the
// keys `dray train` reads) when one is given, else from the plan's defaults
// (a GPU job: bfloat16, 1024x1024, micro-batch 1, FULL_SHARD, LoRA rank 32);
// flags override either. Prints the terms, the total against
// --device-memory and whether it fits and why (--json: one JSON object).
#ifndef DRAY_CLI_PLAN_COMMAND_H_
#define DRAY_CLI_PLAN_COMMAND_H_

#include <memory>
#include <optional>

namespace CLI {
class App;
}  // namespace CLI

namespace dray {

class PlanCommand {
 public:
  // Adds the subcommand to `app`.
  explicit PlanCommand(CLI::App& app);
  ~PlanCommand();

  // Run plans when the subcommand was chosen and returns its exit code
  // (0 whether or not it fits, 1 on an error); nullopt otherwise.
  std::optional<int> Run();

  struct Flags;  // defined in plan_command.cc

 private:
  std::unique_ptr<Flags> flags_;
};

}  // namespace dray

#endif  // DRAY_CLI_PLAN_COMMAND_H_
