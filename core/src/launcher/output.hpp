#pragma once
// Output routing of the launcher's agent (agent.cpp): each worker's stdout and stderr split into
// lines, prefixed "[rank k] " on the launcher's terminal, copied into the rank's log file and
// kept as a short tail for a failure report; rank 0's progress bar passed through unprefixed;
// MPICH hydra's -prepend-rank stream taken apart per rank. Internal to core/src/launcher/.
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace trainrun::core::launcher_output {

constexpr size_t kTailLines = 10;
constexpr size_t kMaxLine = 64 * 1024;

inline void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // a closed terminal or pipe: the log files still get everything
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}
inline void write_all(int fd, const std::string& s) { write_all(fd, s.data(), s.size()); }

// The launcher's terminal side: prefixed lines, and rank 0's progress bar passed through.
class Console {
 public:
  Console() : tty_{isatty(STDOUT_FILENO) == 1, isatty(STDERR_FILENO) == 1} {}
  bool stderr_tty() const { return tty_[1]; }
  /// One whole line to stdout (fd 1) or stderr (fd 2); clears a visible progress bar first.
  void line(int fd, const std::string& prefix, const std::string& text) {
    if (bar_visible_ && tty_[fd == STDERR_FILENO ? 1 : 0]) {
      write_all(STDERR_FILENO, "\r\033[K");
      bar_visible_ = false;
    }
    write_all(fd, prefix + text + "\n");
  }
  void progress(const std::string& segment) {
    write_all(STDERR_FILENO, segment);
    bar_visible_ = true;
  }
  void progress_done() {
    write_all(STDERR_FILENO, "\n");
    bar_visible_ = false;
  }
  /// Whether `text` (one rank's line) is an error line that an earlier rank already printed
  /// word for word: a mistake every rank meets (a bad data row, a LoRA target) is then shown
  /// once, and the failure report names the ranks (error_ranks). Records `rank` either way.
  bool repeated_error(const std::string& text, int rank) {
    if (text.rfind(kErrorPrefix, 0) != 0) return false;
    auto& ranks = errors_[text];
    ranks.push_back(rank);
    return ranks.size() > 1;
  }
  /// The ranks that printed the error line `text`, in the order they did ("" when none).
  std::string error_ranks(const std::string& text) const {
    auto it = errors_.find(text);
    if (it == errors_.end()) return "";
    std::string s;
    for (size_t i = 0; i < it->second.size(); ++i)
      s += (i == 0                       ? ""
            : i + 1 == it->second.size() ? " and "
                                         : ", ") +
           std::to_string(it->second[i]);
    return s;
  }
  static constexpr const char* kErrorPrefix = "trainrun: error: ";

 private:
  bool tty_[2];
  bool bar_visible_ = false;
  std::map<std::string, std::vector<int>> errors_;
};

// Where one rank's lines end up: the console (prefixed), its log file, and the tail kept for a
// failure report.
struct RankSink {
  int rank = 0;
  int log_fd = -1;
  std::string log_path;
  std::deque<std::string> tail;

  void emit(Console& console, int fd, const std::string& text) {
    if (!console.repeated_error(text, rank))
      console.line(fd, "[rank " + std::to_string(rank) + "] ", text);
    if (log_fd >= 0) write_all(log_fd, text + "\n");
    tail.push_back(text);
    if (tail.size() > kTailLines) tail.pop_front();
  }
};

// Splits one worker stream into lines. On rank 0's stderr with a terminal behind the launcher,
// a segment from '\r' up to the erase-line sequence the progress callback ends its redraws
// with is a progress bar update: passed through unprefixed and not logged.
class LineSplitter {
 public:
  LineSplitter(RankSink* sink, int fd, bool progress) : sink_(sink), fd_(fd), progress_(progress) {}

  void feed(Console& console, const char* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const char c = data[i];
      if (in_bar_) {
        bar_ += c;
        if (bar_.size() >= 3 && bar_.compare(bar_.size() - 3, 3, "\033[K") == 0) {
          console.progress(bar_);
          bar_.clear();
          in_bar_ = false;
          after_bar_ = true;
        } else if (c == '\n' || bar_.size() > kMaxLine) {
          // Not a progress redraw after all: an ordinary line that began with '\r'.
          line_ = bar_.substr(1, bar_.size() - (c == '\n' ? 2 : 1));
          bar_.clear();
          in_bar_ = false;
          if (c == '\n') flush_line(console);
        }
        continue;
      }
      if (progress_ && c == '\r') {
        if (!line_.empty()) flush_line(console);
        in_bar_ = true;
        bar_ = "\r";
        continue;
      }
      if (c == '\n') {
        if (after_bar_ && line_.empty()) {
          console.progress_done();  // the bar's final newline
          after_bar_ = false;
          continue;
        }
        flush_line(console);
        continue;
      }
      after_bar_ = false;
      line_ += c;
      if (line_.size() >= kMaxLine) flush_line(console);
    }
  }
  /// At end of stream: a last line without its newline still counts.
  void finish(Console& console) {
    if (in_bar_) line_ = bar_.substr(1), in_bar_ = false;
    if (!line_.empty()) flush_line(console);
  }

 private:
  void flush_line(Console& console) {
    sink_->emit(console, fd_, line_);
    line_.clear();
    after_bar_ = false;
  }
  RankSink* sink_;
  int fd_;
  bool progress_;
  bool in_bar_ = false, after_bar_ = false;
  std::string line_, bar_;
};

// MPICH hydra's -prepend-rank output: every chunk a rank wrote, and every line in it, starts
// with "[k] ". A chunk need not end a line, so a prefix can also appear mid-line; each rank's
// partial line is kept apart and completed by its next chunk. Text of mpiexec itself (no
// prefix) goes to the console as it is and into mpiexec's own tail.
class HydraSplitter {
 public:
  HydraSplitter(std::vector<RankSink>* sinks, int fd, std::deque<std::string>* own_tail)
      : sinks_(sinks), fd_(fd), own_tail_(own_tail), partial_(sinks->size()) {}

  void feed(Console& console, const char* data, size_t n) {
    pending_.append(data, n);
    size_t pos = 0;
    while (pos < pending_.size()) {
      if (pending_[pos] == '[') {
        int rank = -1;
        const size_t len = prefix_at(pos, &rank);
        if (len == kIncomplete) break;  // wait for the rest of a possible prefix
        if (len > 0) {
          current_ = rank;
          pos += len;
          continue;
        }
      }
      const char c = pending_[pos++];
      std::string& buf = current_ >= 0 ? partial_[current_] : own_;
      if (c == '\n') {
        emit(console, current_, buf);
        buf.clear();
        current_ = -1;
      } else {
        buf += c;
        if (buf.size() >= kMaxLine) emit(console, current_, buf), buf.clear();
      }
    }
    pending_.erase(0, pos);
  }
  void finish(Console& console) {
    for (char c : pending_) (current_ >= 0 ? partial_[current_] : own_) += c;
    pending_.clear();
    for (size_t r = 0; r < partial_.size(); ++r)
      if (!partial_[r].empty()) emit(console, static_cast<int>(r), partial_[r]), partial_[r].clear();
    if (!own_.empty()) emit(console, -1, own_), own_.clear();
  }

 private:
  static constexpr size_t kIncomplete = static_cast<size_t>(-1);
  // Length of a "[k] " prefix with 0 <= k < ranks at pos, 0 if there is none, kIncomplete if
  // the buffer ends before it can be told.
  size_t prefix_at(size_t pos, int* rank) const {
    size_t i = pos + 1;
    while (i < pending_.size() && i - pos <= 8 && std::isdigit(static_cast<unsigned char>(pending_[i]))) ++i;
    if (i == pending_.size() || i + 1 == pending_.size()) return kIncomplete;
    if (i == pos + 1 || pending_[i] != ']' || pending_[i + 1] != ' ') return 0;
    const int k = std::atoi(pending_.substr(pos + 1, i - pos - 1).c_str());
    if (k >= static_cast<int>(partial_.size())) return 0;
    *rank = k;
    return i + 2 - pos;
  }
  void emit(Console& console, int rank, const std::string& text) {
    if (rank >= 0) {
      (*sinks_)[rank].emit(console, fd_, text);
      own_tail_->push_back("[rank " + std::to_string(rank) + "] " + text);
    } else {
      console.line(fd_, "", text);
      own_tail_->push_back(text);
    }
    if (own_tail_->size() > kTailLines) own_tail_->pop_front();
  }
  std::vector<RankSink>* sinks_;
  int fd_;
  std::deque<std::string>* own_tail_;
  std::vector<std::string> partial_;
  std::string own_, pending_;
  int current_ = -1;
};

}  // namespace trainrun::core::launcher_output
