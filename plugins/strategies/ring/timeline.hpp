#pragma once
// The ring strategy's timeline, after Horovod's HOROVOD_TIMELINE: a Chrome trace (Trace Event
// Format; open it in Perfetto or chrome://tracing) per rank, one track per tensor with the phases
// of its reduction in every recorded step, and track 0 for the negotiation rounds and the fused
// buffers. The strategy's other parts note when things happen (TensorTimes, RoundSpan,
// BufferSpan); this part keeps the recorded steps and writes the file.
#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::plugins::ring_strategy {

/// The per-rank timeline file, named as the metrics callback names per-rank files:
/// "dir/t.json" -> "dir/t-rank-3.json" ("-rank-3" appended when the name has no extension); a
/// relative path is taken relative to `run_dir`.
std::string timeline_path_for_rank(const std::string& path, const std::string& run_dir, int rank);

/// Microseconds on the steady clock: the time base of every span below.
double now_us();

/// When one tensor went through each phase of one reduction pass (µs), and its fused buffer.
struct TensorTimes {
  double ready = 0;   ///< its gradient is final on this rank
  double agreed = 0;  ///< the negotiation round that found it ready everywhere ended
  double in0 = 0, in1 = 0, red0 = 0, red1 = 0, out0 = 0, out1 = 0;  ///< copy in, reduce, copy out
  int buffer = -1;  ///< fused buffer number within the step
};

/// A negotiation round that agreed on at least one tensor.
struct RoundSpan {
  double t0 = 0, t1 = 0;
  int64_t round = 0;
};

/// One fused buffer: filled from t0, reduced from red0 to red1, emptied by t1.
struct BufferSpan {
  double t0 = 0, t1 = 0, red0 = 0, red1 = 0;
  int64_t tensors = 0, bytes = 0, round = 0;
  std::string dtype;  ///< on the wire
};

/// What the file says about the run (its otherData).
struct TimelineRun {
  int rank = 0;
  int world_size = 1;
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0;
  std::string compression;
  bool hierarchical = false;
};

/// One rank's timeline. Steps are recorded by the background thread and written by the main
/// thread, which the strategy's hand-over of each pass keeps apart.
class Timeline {
 public:
  /// One recorded step: record()'s arguments.
  struct Step {
    int64_t step = 0;
    double t_backward = 0;
    std::vector<TensorTimes> tensors;
    std::vector<RoundSpan> rounds;
    std::vector<BufferSpan> buffers;
  };

  /// `path`: this rank's file, empty for no timeline; `max_steps`: how many steps are recorded
  /// (0 = every step); `who` names the strategy in messages.
  Timeline(std::string who, std::string path, int64_t max_steps);

  /// The tensor tracks, in the order of record()'s `tensors`: names and sizes in bytes.
  void set_tensors(std::vector<std::string> names, std::vector<int64_t> bytes);
  /// Whether step `step` (1-based) is to be recorded.
  bool records(int64_t step) const;
  /// Keeps step `step`: every tensor's phases (WAIT_FOR_READY from `t_backward`, the end of the
  /// synchronised forward, when it is set), the rounds that agreed, the fused buffers.
  void record(int64_t step, double t_backward, const std::vector<TensorTimes>& tensors,
              const std::vector<RoundSpan>& rounds, const std::vector<BufferSpan>& buffers);
  /// Whether the file is due once `steps` steps are done: the last step to record is, and it is
  /// not written yet.
  bool due(int64_t steps) const;
  /// Whether steps were recorded since the file was last written.
  bool dirty() const { return dirty_; }
  /// Writes every step recorded so far, replacing the file atomically (a reader sees the old
  /// file or the new one). Throws Error naming the file when it cannot be written.
  void write(const TimelineRun& run);

 private:
  std::string who_;
  std::string path_;
  int64_t max_steps_;
  std::vector<std::string> names_;
  std::vector<int64_t> bytes_;
  std::vector<Step> steps_;
  bool dirty_ = false;
};

}  // namespace trainrun::plugins::ring_strategy
