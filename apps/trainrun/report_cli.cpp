// `trainrun report RUN_DIR [--compare OTHER...] [--output FILE]`: the page is drawn by the
// report library (report/); this file reads the command line and adds what needs the core and
// the plugins: `trainrun check`'s memory estimate for each run's job.toml.
#include "report.hpp"
#include "command_line.hpp"

#include <filesystem>
#include <iostream>
#include <stdexcept>

#include "trainrun/core/config.hpp"
#include "trainrun/core/memory.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/report/report.hpp"

namespace trainrun::app {
namespace {

namespace fs = std::filesystem;

/// The `trainrun check` estimate for the run's own job.toml. The job is validated again with
/// the plugins found now, so a run whose plugins or data moved gets a note instead.
report::Estimate estimate_of(const std::string& run_dir) {
  report::Estimate out;
  static const char* kStageNames[] = {"0 (replicated)", "1 (optimizer state sharded)",
                                      "2 (+ gradients)", "3 (+ parameters)"};
  try {
    auto job_file = core::JobFile::load((fs::path(run_dir) / "job.toml").string(), {});
    core::Registry reg;
    reg.load_search_path(core::Registry::search_path({}, job_file.plugin_paths()));
    const core::JobConfig job = job_file.validate(reg);
    out.components = "model " + job.model.plugin + " | data " + job.data.plugin + " | strategy " +
                     job.strategy.plugin + " | accelerator " + job.accelerator.plugin +
                     " | precision " + job.precision.plugin + " | optimizer " + job.optimizer.plugin;
    const core::MemoryCheck check = core::check_memory(job, reg);
    out.lines = check.lines;
    const int stage = core::zero_stage_of(job);
    for (int s = 0; s < 4; ++s) {
      if (stage >= 0 && s != stage) continue;
      out.series.emplace_back(std::string("estimate, ZeRO stage ") + kStageNames[s],
                                 check.stages[s].model_state_bytes);
      if (check.activation_bytes >= 0)
        out.peak_series.emplace_back(
            std::string("estimate (total + activations), ZeRO stage ") + kStageNames[s],
            check.stages[s].total_bytes + check.activation_bytes);
    }
    out.note = stage >= 0
                            ? "strategy " + job.strategy.plugin + " holds the model state of ZeRO stage " +
                                  std::to_string(stage)
                            : "strategy " + job.strategy.plugin +
                                  " decides its sharding at run time: every stage is shown";
  } catch (const std::exception& e) {
    out.note = std::string("no estimate: ") + e.what();
  }
  return out;
}

void usage(std::ostream& os) {
  os << "usage: trainrun report RUN_DIR [--compare OTHER_RUN_DIR]... [--output FILE]\n"
        "Writes one self-contained HTML page (default RUN_DIR/report.html) with the run's curves:\n"
        "training and held-out loss, learning rate, gradient norm, throughput, step time split into\n"
        "compute and exposed communication, memory per rank against trainrun check's estimate, loss\n"
        "scale and skipped steps when present; the runtime banner and the resolved job.\n"
        "  --compare DIR   overlay another run (repeatable)\n"
        "  --output FILE   where to write the page\n"
        "  -h, --help      this help\n";
}

}  // namespace

int run_report_command(int argc, char** argv) {
  std::vector<std::string> dirs;
  std::string output;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(std::cout);
      return 0;
    } else if (a == "--compare" || a == "--output") {
      if (i + 1 >= argc) {
        std::cerr << "trainrun report: error: " << a << " needs a value\n";
        usage(std::cerr);
        return 2;
      }
      if (a == "--compare" && dirs.empty()) {
        std::cerr << "trainrun report: error: give RUN_DIR before --compare\n";
        return 2;
      }
      (a == "--output" ? output : dirs.emplace_back()) = argv[++i];
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "trainrun report: error: unknown option '" << a << "'\n";
      usage(std::cerr);
      return 2;
    } else if (dirs.empty()) {
      dirs.push_back(a);
    } else {
      std::cerr << "trainrun report: error: more than one RUN_DIR ('" << dirs.front() << "', '" << a
                << "'); overlay runs with --compare\n";
      return 2;
    }
  }
  if (dirs.empty()) {
    usage(std::cerr);
    return 2;
  }
  if (output.empty()) output = (fs::path(dirs.front()) / "report.html").string();
  try {
    report::write_report(dirs, output, estimate_of);
  } catch (...) {
    return command_failure<std::invalid_argument>("report");
  }
  std::cout << "wrote " << output << std::endl;
  return 0;
}

}  // namespace trainrun::app
