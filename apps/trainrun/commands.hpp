#pragma once
// The table of `trainrun` subcommands: main() dispatches through it and `trainrun --help` is
// printed from it, so a new command is one row here plus its own file (run_<name>_command,
// its options through Boost.Program_options, its own --help).

#include <string>
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

/// Called in a catch block of command `command` ("trainrun", "trainrun bench"): prints the
/// exception in flight as "COMMAND: error: WHAT" on stderr in one write and returns the exit
/// code: 2 for bad input (v1::ConfigError, v1::PluginError), 1 for any other std::exception (a
/// c10::Error without its C++ backtrace). Rethrows anything else.
int report_failure(const std::string& command);

/// The checkpoint a command's CHECKPOINT argument names: the newest complete one for a
/// checkpoints directory (no meta.json, a `latest` pointer file) or for its `latest` file, else
/// `arg` itself.
std::string checkpoint_of(const std::string& arg);

/// `trainrun consolidate CHECKPOINT OUT [--max-shard-size S]`: one full model from a checkpoint
/// written at any world size.
int run_consolidate_command(int argc, char** argv);

}  // namespace trainrun::app
