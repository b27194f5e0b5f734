#pragma once
// The run directory: where a job's outputs go, and keeping an earlier run's outputs apart. Used
// by the trainer, the launcher (before its workers start) and the command line.
#include <memory>
#include <string>

#include "trainrun/core/config.hpp"

namespace trainrun::core {

/// [trainer] run_dir, or runs/<job file name> when it is empty.
std::string run_dir_of(const JobConfig& job);

/// When `run_dir` already holds a run (job.toml or logs/), moves that run's files and logs/ to
/// run_dir/previous-N, so two runs never mix and nothing is overwritten. Returns the directory
/// they moved to, or "" when there was nothing to move.
std::string keep_previous_run(const std::string& run_dir);

/// The lock a live run holds on its run_dir: an flock(2) on <run_dir>/trainrun.lock, which
/// names the holder ("pid P host H"). The kernel releases it when the process ends however it
/// ends, so a lock file left by a killed run is stale and is taken over (with a note). Taken by
/// the process that prepares run_dir (the launcher of node 0, or a run without our launcher)
/// before it moves an earlier run aside, and held until it ends.
class RunDirLock {
 public:
  /// Creates run_dir if needed and locks it. Throws v1::ConfigError naming run_dir and the
  /// live holder's pid and host when another process holds it, v1::ConfigError when run_dir
  /// cannot be created or written (read-only, permissions).
  static std::unique_ptr<RunDirLock> acquire(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  explicit RunDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

/// The name of the lock file inside run_dir (never moved by keep_previous_run).
inline constexpr const char* kRunDirLockFile = "trainrun.lock";

}  // namespace trainrun::core
