#pragma once
// A small logger for plugins. Each message is one line, "<name>: <text>", written whole (a
// worker's output is a pipe the launcher reads in chunks: a message must not be split) to the
// rank's standard streams, which the launcher routes into
// <run_dir>/logs/rank-N.log and, prefixed with the rank, to the console. Header-only: it adds
// nothing to the ABI.
#include <cstdlib>
#include <iostream>
#include <string>
#include <string_view>

namespace trainrun::v1 {

/// Message levels, lowest first.
enum class LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 };

/// One component's logger. Debug and info lines go to standard output, warnings and errors to
/// standard error ("<name>: warning: <text>", "<name>: error: <text>"). The environment variable
/// TRAINRUN_LOG_LEVEL (debug, info, warn or error; default info) hides the levels below it.
/// `rank` is the RunContext's rank: the *_rank0 calls write on rank 0 only, for what every rank
/// would say alike (a plan, a summary); the others write on every rank. A text holding newlines
/// is written as it is, still in one write.
class Logger {
 public:
  Logger(std::string name, int rank) : name_(std::move(name)), rank_(rank) {}

  void debug(std::string_view text) const { write(LogLevel::Debug, text); }
  void info(std::string_view text) const { write(LogLevel::Info, text); }
  void info_rank0(std::string_view text) const {
    if (rank_ == 0) write(LogLevel::Info, text);
  }
  void warn(std::string_view text) const { write(LogLevel::Warn, text); }
  void warn_rank0(std::string_view text) const {
    if (rank_ == 0) write(LogLevel::Warn, text);
  }
  void error(std::string_view text) const { write(LogLevel::Error, text); }

  int rank() const { return rank_; }
  const std::string& name() const { return name_; }

  /// TRAINRUN_LOG_LEVEL, read once per process; an unknown value means info.
  static LogLevel threshold() {
    static const LogLevel level = [] {
      const char* v = std::getenv("TRAINRUN_LOG_LEVEL");
      const std::string s = v ? v : "";
      return s == "debug"   ? LogLevel::Debug
             : s == "warn"  ? LogLevel::Warn
             : s == "error" ? LogLevel::Error
                            : LogLevel::Info;
    }();
    return level;
  }

 private:
  void write(LogLevel level, std::string_view text) const {
    if (level < threshold()) return;
    std::string line = name_ + ": ";
    if (level == LogLevel::Warn) line += "warning: ";
    if (level == LogLevel::Error) line += "error: ";
    line.append(text.data(), text.size());
    if (line.empty() || line.back() != '\n') line += '\n';
    // Through the C++ streams, as one insertion and a flush (one write(2) while the stream's
    // buffer is empty, as it is after every flush): the core and other plugins print through
    // them too, so their lines stay in order.
    std::ostream& out = level >= LogLevel::Warn ? std::cerr : std::cout;
    out << line << std::flush;
  }

  std::string name_;
  int rank_;
};

}  // namespace trainrun::v1
