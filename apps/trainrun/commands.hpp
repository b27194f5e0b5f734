#pragma once
// The table of `trainrun` subcommands: main() dispatches through it and `trainrun --help` is
// printed from it, so a new command is one row here plus its own file (run_<name>_command,
// its options through Boost.Program_options, its own --help).

#include <vector>

namespace trainrun::app {

/// One subcommand. `run` gets argv as main() received it (argv[1] is the command's name) and
/// returns the process exit code: 0 ok, 1 a failure while working, 2 bad input.
struct Command {
  const char* name;
  /// What follows "trainrun " in the usage line(s) of `trainrun --help` (several lines joined
  /// by "\n"); empty where another row's line covers it (decode's is encode's).
  const char* usage;
  int (*run)(int argc, char** argv);
  /// Not a user command (a child process the binary starts itself): never listed.
  bool internal = false;
};

/// Every subcommand but the job commands (train, check, plugins), which share main()'s
/// --config/--set parser. In the order `trainrun --help` lists them.
const std::vector<Command>& subcommands();

/// `trainrun consolidate CHECKPOINT OUT [--max-shard-size S]`: one full model from a checkpoint
/// written at any world size.
int run_consolidate_command(int argc, char** argv);

}  // namespace trainrun::app
