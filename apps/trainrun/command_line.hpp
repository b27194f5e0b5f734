#pragma once
// The command line of one `trainrun` subcommand (commands.hpp), parsed the same way by each:
// Boost.Program_options, the same error and --help output.
#include <boost/program_options.hpp>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

namespace trainrun::app {

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
  po::options_description all;
  all.add(opts);
  po::positional_options_description pos;
  if (positional) {
    po::options_description hidden;
    hidden.add_options()("positional-arguments", po::value(positional)->composing());
    all.add(hidden);
    pos.add("positional-arguments", -1);
  }
  try {
    po::store(po::command_line_parser(argc - 1, argv + 1).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "trainrun " << name << ": error: " << e.what() << "\n" << opts << std::endl;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << usage << "\n\n" << opts << std::endl;
    return 0;
  }
  return std::nullopt;
}

}  // namespace trainrun::app
