#pragma once
// The command line of one `trainrun` subcommand (commands.hpp), parsed the same way by each:
// Boost.Program_options, the same error and --help output.
#include <boost/program_options.hpp>

#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace trainrun::app {

/// Prints "trainrun COMMAND: error: MESSAGE" on stderr; returns 2, the exit code of bad input.
inline int command_error(const std::string& command, const std::string& message) {
  std::cerr << "trainrun " << command << ": error: " << message << std::endl;
  return 2;
}

/// Called in a catch block of `trainrun COMMAND`: prints the exception in flight with
/// command_error and returns the exit code: 2 when it is a `BadInput` (what the command counts as
/// bad input), 1 for any other std::exception. Rethrows anything else.
template <class BadInput>
int command_failure(const std::string& command) {
  try {
    throw;
  } catch (const BadInput& e) {
    return command_error(command, e.what());
  } catch (const std::exception& e) {
    command_error(command, e.what());
    return 1;
  }
}

/// Stores argv[1..] (argv[0] is skipped as the program's name) parsed against `opts` and the
/// undocumented `hidden`, non-flag arguments going to `pos`, into `vm`. After a parse error
/// prints "PREFIX: error: WHAT" and `opts` on stderr and returns false.
inline bool store_command_line(int argc, char** argv, const std::string& prefix,
                               const boost::program_options::options_description& opts,
                               const boost::program_options::options_description& hidden,
                               const boost::program_options::positional_options_description& pos,
                               boost::program_options::variables_map& vm) {
  namespace po = boost::program_options;
  po::options_description all;
  all.add(opts).add(hidden);
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << prefix << ": error: " << e.what() << "\n" << opts << std::endl;
    return false;
  }
  return true;
}

/// Parses argv[2..] (argv as main() received it; argv[1] is the command `name`) against `opts`,
/// which declares "help,h" among its flags; with `positional`, every argument that is not a flag
/// is collected there. Returns the exit code for the command to return at once: 2 after a parse
/// error ("trainrun NAME: error: WHAT" and the options, on stderr), 0 after --help (`usage`, a
/// blank line and the options, on stdout); nullopt when the command goes on with `vm` filled.
inline std::optional<int> parse_command_line(
    int argc, char** argv, const std::string& name, const std::string& usage,
    const boost::program_options::options_description& opts,
    boost::program_options::variables_map& vm, std::vector<std::string>* positional = nullptr) {
  namespace po = boost::program_options;
  po::options_description hidden;
  po::positional_options_description pos;
  if (positional) {
    hidden.add_options()("positional-arguments", po::value(positional)->composing());
    pos.add("positional-arguments", -1);
  }
  if (!store_command_line(argc - 1, argv + 1, "trainrun " + name, opts, hidden, pos, vm)) return 2;
  if (vm.count("help")) {
    std::cout << usage << "\n\n" << opts << std::endl;
    return 0;
  }
  return std::nullopt;
}

}  // namespace trainrun::app
