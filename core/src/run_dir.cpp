#include "trainrun/core/run_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "trainrun/core/log.hpp"
#include "trainrun/error.hpp"

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
    if (name == kRunDirLockFile) continue;
    if (e.is_regular_file() ||
        (e.is_directory() && (name == "logs" || name == "runtime" || name == "tb")))
      moving.push_back(e.path());
  }
  for (const auto& p : moving) fs::rename(p, dst / p.filename());
  log_info("run_dir " + dir.string() + " held an earlier run: its files are now in " +
           dst.string());
  return dst.string();
}

std::unique_ptr<RunDirLock> RunDirLock::acquire(const std::string& run_dir) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  if (ec)
    throw v1::ConfigError("[trainer] run_dir = \"" + run_dir + "\": cannot create it: " + ec.message());
  const std::string path = (fs::path(run_dir) / kRunDirLockFile).string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    throw v1::ConfigError("[trainer] run_dir = \"" + run_dir + "\" is not writable: cannot create " +
                          path + ": " + std::strerror(errno));
  auto holder = [&] {
    char buf[512] = {};
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    std::string s = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  };
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int e = errno;
    const std::string who = holder();
    ::close(fd);
    if (e == EWOULDBLOCK)
      throw v1::ConfigError("[trainer] run_dir = \"" + run_dir + "\" is in use by a running trainrun (" +
                            (who.empty() ? std::string("holder unknown") : who) +
                            "; lock file " + path + "); wait for it to end or give this run another run_dir");
    throw v1::ConfigError("[trainer] run_dir = \"" + run_dir + "\": cannot lock " + path + ": " + std::strerror(e));
  }
  const std::string stale = holder();
  if (!stale.empty())
    log_info("run_dir " + run_dir + ": the lock of an earlier run (" + stale +
             ") was stale (that process has ended); taking it over");
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  const std::string me = "pid " + std::to_string(getpid()) + " host " + host + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
    const int e = errno;
    ::close(fd);
    throw v1::ConfigError("[trainer] run_dir = \"" + run_dir + "\" is not writable: " + path + ": " + std::strerror(e));
  }
  return std::unique_ptr<RunDirLock>(new RunDirLock(fd));
}

RunDirLock::~RunDirLock() {
  // Emptied, so that the next run does not report it as stale; the file stays (removing it
  // would race with a run that has just opened it).
  if (fd_ >= 0) {
    [[maybe_unused]] int r = ::ftruncate(fd_, 0);
    ::close(fd_);
  }
}

std::string run_dir_of(const JobConfig& job) {
  std::string run_dir = job.trainer.get_string("run_dir");
  if (run_dir.empty()) run_dir = (fs::path("runs") / fs::path(job.file).stem()).string();
  return run_dir;
}

}  // namespace trainrun::core
