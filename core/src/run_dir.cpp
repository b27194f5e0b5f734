#include "trainrun/core/run_dir.hpp"

#include <filesystem>
#include <string>
#include <vector>

#include "trainrun/core/log.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

// A run_dir that already holds a run keeps it: that run's files (and its logs/ folder of
// per-rank output and tb/ of TensorBoard events) move to previous-N/, so the metrics of two runs
// never mix and nothing is overwritten. A run that failed before writing job.toml may still have
// left logs/.
std::string keep_previous_run(const std::string& run_dir) {
  const fs::path dir(run_dir);
  if (!fs::exists(dir / "job.toml") && !fs::exists(dir / "logs")) return "";
  int n = 1;
  while (fs::exists(dir / ("previous-" + std::to_string(n)))) ++n;
  const fs::path dst = dir / ("previous-" + std::to_string(n));
  fs::create_directory(dst);
  // The earlier run's files and the folders trainrun itself writes move; other folders stay,
  // so a run_dir that also holds the user's own folders never has them moved.
  std::vector<fs::path> moving;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() ||
        (e.is_directory() && (name == "logs" || name == "runtime" || name == "tb")))
      moving.push_back(e.path());
  }
  for (const auto& p : moving) fs::rename(p, dst / p.filename());
  log_info("run_dir " + dir.string() + " held an earlier run: its files are now in " +
           dst.string());
  return dst.string();
}

std::string run_dir_of(const JobConfig& job) {
  std::string run_dir = job.trainer.get_string("run_dir");
  if (run_dir.empty()) run_dir = (fs::path("runs") / fs::path(job.file).stem()).string();
  return run_dir;
}

}  // namespace trainrun::core
