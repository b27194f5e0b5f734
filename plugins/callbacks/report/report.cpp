#include "report.hpp"

#include <trainrun/report/report.hpp>

#include <filesystem>
#include <iostream>

namespace trainrun::plugins {

namespace fs = std::filesystem;
using namespace trainrun::v1;

void ReportCallback::declare_options(OptionSchema& schema) {
  schema.boolean("enabled", true,
                 "write the report at the end of the run; false turns off the callback the core "
                 "adds by default");
  schema.string("output", "report.html", "the page's file name, relative to the run directory");
}

ReportCallback::ReportCallback(const Options& options, const RunContext& ctx) {
  const std::string& output = options.get_string("output");
  TR_CHECK_TYPED(ConfigError, !output.empty(), options.context(), ": output must not be empty");
  if (!options.get_bool("enabled") || ctx.rank != 0) return;
  run_dir_ = ctx.run_dir;
  output_ = (fs::path(ctx.run_dir) / output).string();
}

void ReportCallback::on_train_end(const TrainSummary&) {
  if (output_.empty()) return;
  try {
    report::write_report({run_dir_}, output_, [](const std::string& run_dir) {
      report::Estimate e;
      e.note = "not in the page written at the end of the run: `trainrun report " + run_dir +
               "` adds trainrun check's estimate";
      return e;
    });
    std::cerr << "[trainrun] wrote " << output_ << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "[trainrun] warning: report: " << output_ << " not written: " << e.what()
              << std::endl;
  }
}

}  // namespace trainrun::plugins
