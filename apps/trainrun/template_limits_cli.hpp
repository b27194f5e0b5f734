#pragma once
// --template-max-bytes and --template-max-operations for the commands that parse their flags
// with boost::program_options (generate, score): the chat-template budget of
// trainrun/text/template_limits.hpp, under the same names as chat-template's flags.
#include <boost/program_options.hpp>
#include <string>

#include "trainrun/text/chat_template.hpp"

namespace trainrun::app {

/// Adds the two flags to `opts`, writing into `limits` (which keeps its defaults when absent).
inline void add_template_limit_options(boost::program_options::options_description& opts,
                                       text::TemplateLimits& limits) {
  namespace po = boost::program_options;
  const std::string bytes_help = "budget of one chat-template rendering, bytes built (default " +
                                 std::to_string(limits.max_bytes) + ")";
  const std::string ops_help = "budget of one chat-template rendering, operations (default " +
                               std::to_string(limits.max_operations) + ")";
  opts.add_options()("template-max-bytes", po::value(&limits.max_bytes), bytes_help.c_str())(
      "template-max-operations", po::value(&limits.max_operations), ops_help.c_str());
}

}  // namespace trainrun::app
