// `trainrun consolidate <checkpoint> <out> [--max-shard-size BYTES]`: one full model from the
// pieces of a checkpoint written at any world size, one output shard in memory at a time.
#include <boost/program_options.hpp>

#include <filesystem>
#include <iostream>

#include "command_line.hpp"
#include "commands.hpp"
#include "trainrun/core/checkpoint.hpp"
#include "trainrun/core/config.hpp"
#include "trainrun/error.hpp"

namespace po = boost::program_options;

namespace trainrun::app {

std::string checkpoint_of(const std::string& arg) {
  namespace fs = std::filesystem;
  if (fs::is_regular_file(arg) && fs::path(arg).filename() == "latest")
    return core::resolve_checkpoint("latest", fs::path(arg).parent_path().string(), false);
  if (fs::is_directory(arg) && !fs::exists(fs::path(arg) / "meta.json") &&
      fs::exists(fs::path(arg) / "latest"))
    return core::resolve_checkpoint("latest", arg, false);
  return arg;
}

int run_consolidate_command(int argc, char** argv) {
  std::vector<std::string> args;
  std::string max_shard_text;
  po::options_description opts("trainrun consolidate options");
  opts.add_options()("help,h", "show this help")(
      "max-shard-size", po::value(&max_shard_text),
      "largest output shard: bytes, optionally with KB/MB/GB/KiB/MiB/GiB (default: one file)");
  po::variables_map vm;
  if (const auto done = parse_command_line(
          argc, argv, "consolidate",
          "usage: trainrun consolidate <checkpoint dir> <out dir> [--max-shard-size 5GB]\n"
          "Writes <out>/model.safetensors (or model-0000k-of-0000n.safetensors and "
          "model.safetensors.index.json) from a checkpoint written at any world size, one output "
          "shard in memory at a time.",
          opts, vm, &args))
    return *done;
  int64_t max_shard = 0;
  if (vm.count("max-shard-size")) {
    // The job file's size syntax (core::parse_size), and a shard needs at least a byte.
    try {
      max_shard = core::parse_size(max_shard_text);
    } catch (const std::invalid_argument&) {
      max_shard = 0;
    }
    if (max_shard <= 0) {
      std::cerr << "trainrun consolidate: --max-shard-size '" << max_shard_text
                << "': give bytes, optionally with KB/MB/GB/KiB/MiB/GiB" << std::endl;
      return 2;
    }
  }
  if (args.size() != 2) {
    std::cerr << "trainrun consolidate: give <checkpoint dir> <out dir> (see --help)" << std::endl;
    return 2;
  }
  try {
    namespace fs = std::filesystem;
    if (!fs::exists(args[0])) {
      std::cerr << "trainrun consolidate: error: " << args[0] << ": no such checkpoint directory"
                << std::endl;
      return 2;
    }
    // The checkpoints directory, or its `latest` pointer file, names the newest complete
    // checkpoint: take that one rather than calling the pointer an incomplete checkpoint.
    const std::string src = checkpoint_of(args[0]);
    const int64_t n = core::consolidate_checkpoint(src, args[1], max_shard);
    std::cout << "consolidated " << n << " tensors from " << src << " into " << args[1]
              << std::endl;
    return 0;
  } catch (...) {
    // A missing, incomplete or corrupt checkpoint (v1::Error) is bad input.
    return command_failure<v1::Error>("consolidate");
  }
}

}  // namespace trainrun::app
