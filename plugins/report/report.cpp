#include "report.hpp"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

extern char** environ;

namespace trainrun::plugins {

namespace fs = std::filesystem;
using namespace trainrun::v1;

namespace report {

std::vector<std::string> command(const std::string& exe, const std::string& run_dir,
                                 const std::string& output) {
  return {exe, "report", run_dir, "--output", output};
}

std::string trainrun_executable() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec || self.filename() != "trainrun") return "";
  return self.string();
}

}  // namespace report

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
  const std::string exe = report::trainrun_executable();
  if (exe.empty()) {
    std::cerr << "[trainrun] report: this process is not the trainrun binary; run `trainrun "
                 "report " << run_dir_ << "` for " << output_ << std::endl;
    return;
  }
  const auto args = report::command(exe, run_dir_, output_);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The child's "wrote ..." line goes to stderr with the other notes: stdout's last line stays
  // the final evaluation.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    std::cerr << "[trainrun] warning: report: cannot start " << exe << ": " << std::strerror(rc)
              << std::endl;
    return;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    std::cerr << "[trainrun] warning: report: `trainrun report " << run_dir_ << "` failed ("
              << (WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                    : "signal " + std::to_string(WTERMSIG(status)))
              << "); " << output_ << " not written" << std::endl;
}

}  // namespace trainrun::plugins
