#include "timeline.hpp"

#include <trainrun/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <utility>

namespace trainrun::plugins::ring_strategy {

namespace {

using Json = nlohmann::ordered_json;  // fields in the order the trace format lists them

// Microseconds to the nanosecond: finer digits are clock noise and would only bloat the file.
double us(double t) { return std::round(t * 1000.0) / 1000.0; }

// A complete ("X") event on track `tid` of process `pid`.
Json complete_event(const char* name, int pid, int tid, double ts, double dur, Json args) {
  return Json{{"name", name},
              {"cat", "ring"},
              {"ph", "X"},
              {"ts", us(ts)},
              {"dur", us(std::max(0.0, dur))},
              {"pid", pid},
              {"tid", tid},
              {"args", std::move(args)}};
}

// Metadata ("M") event: a process's or a track's name or sort position.
Json metadata_event(const char* name, int pid, int tid, Json args) {
  return Json{{"name", name}, {"ph", "M"}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
}

// Metadata: one process per rank, one track per tensor plus track 0 for the negotiation rounds
// and the fused buffers.
Json track_events(int pid, const std::vector<std::string>& names) {
  Json events = Json::array();
  events.push_back(
      metadata_event("process_name", pid, 0, {{"name", "rank " + std::to_string(pid)}}));
  events.push_back(metadata_event("process_sort_index", pid, 0, {{"sort_index", pid}}));
  events.push_back(
      metadata_event("thread_name", pid, 0, {{"name", "ring: negotiation and fused buffers"}}));
  for (size_t i = 0; i < names.size(); ++i) {
    const int tid = static_cast<int>(i) + 1;
    events.push_back(metadata_event("thread_name", pid, tid, {{"name", names[i]}}));
    events.push_back(metadata_event("thread_sort_index", pid, tid, {{"sort_index", tid}}));
  }
  return events;
}

// One step's events: every tensor's phases on its track, then the rounds and the fused buffers
// on track 0. `bytes`: each tensor's size.
void add_step_events(Json& events, int pid, const Timeline::Step& st,
                     const std::vector<int64_t>& bytes) {
  const Json step{{"step", st.step}};
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const TensorTimes& t = st.tensors[i];
    const int tid = static_cast<int>(i) + 1;
    Json buf = step;
    buf["buffer"] = t.buffer;
    Json reduced = buf;
    reduced["bytes"] = bytes[i];
    // Waiting starts when backward can start: the end of the synchronised forward.
    const double wait0 = st.t_backward > 0 ? std::min(st.t_backward, t.ready) : t.ready;
    events.push_back(complete_event("WAIT_FOR_READY", pid, tid, wait0, t.ready - wait0, step));
    events.push_back(
        complete_event("NEGOTIATE", pid, tid, t.ready, std::max(0.0, t.agreed - t.ready), step));
    events.push_back(
        complete_event("MEMCPY_IN_FUSION_BUFFER", pid, tid, t.in0, t.in1 - t.in0, buf));
    events.push_back(complete_event("RING_ALLREDUCE", pid, tid, t.red0, t.red1 - t.red0, reduced));
    events.push_back(
        complete_event("MEMCPY_OUT_FUSION_BUFFER", pid, tid, t.out0, t.out1 - t.out0, buf));
  }
  for (const RoundSpan& r : st.rounds) {
    Json args = step;
    args["round"] = r.round;
    events.push_back(complete_event("NEGOTIATION_ROUND", pid, 0, r.t0, r.t1 - r.t0, args));
  }
  for (size_t k = 0; k < st.buffers.size(); ++k) {
    const BufferSpan& b = st.buffers[k];
    Json args = step;
    args["buffer"] = k;
    args["round"] = b.round;
    args["tensors"] = b.tensors;
    args["bytes"] = b.bytes;
    args["wire_dtype"] = b.dtype;
    args["allreduce_us"] = us(b.red1 - b.red0);
    events.push_back(complete_event("FUSED_BUFFER", pid, 0, b.t0, b.t1 - b.t0, args));
  }
}

}  // namespace

std::string timeline_path_for_rank(const std::string& path, const std::string& run_dir, int rank) {
  std::filesystem::path p(path);
  if (p.is_relative() && !run_dir.empty()) p = std::filesystem::path(run_dir) / p;
  const std::string ext = p.extension().string();
  const std::string stem = p.stem().string();
  return (p.parent_path() / (stem + "-rank-" + std::to_string(rank) + ext)).string();
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Timeline::Timeline(std::string who, std::string path, int64_t max_steps)
    : who_(std::move(who)), path_(std::move(path)), max_steps_(max_steps) {}

void Timeline::set_tensors(std::vector<std::string> names, std::vector<int64_t> bytes) {
  names_ = std::move(names);
  bytes_ = std::move(bytes);
}

bool Timeline::records(int64_t step) const {
  return !path_.empty() && (max_steps_ == 0 || step <= max_steps_);
}

void Timeline::record(int64_t step, double t_backward, const std::vector<TensorTimes>& tensors,
                      const std::vector<RoundSpan>& rounds,
                      const std::vector<BufferSpan>& buffers) {
  steps_.push_back({step, t_backward, tensors, rounds, buffers});
  dirty_ = true;
}

bool Timeline::due(int64_t steps) const { return dirty_ && max_steps_ > 0 && steps == max_steps_; }

void Timeline::write(const TimelineRun& run) {
  Json events = track_events(run.rank, names_);
  for (const Step& st : steps_) add_step_events(events, run.rank, st, bytes_);
  const Json other{{"strategy", "ring"},
                   {"rank", run.rank},
                   {"world_size", run.world_size},
                   {"fusion_threshold_bytes", run.fusion_threshold_bytes},
                   {"cycle_time_ms", run.cycle_time_ms},
                   {"compression", run.compression},
                   {"hierarchical", run.hierarchical}};
  // A tensor name that is not UTF-8 is written with U+FFFD rather than failing the run.
  auto dump = [](const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); };

  const std::filesystem::path path(path_);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    TR_CHECK(f.good(), who_, ": cannot write the timeline to '", tmp, "'");
    // One event a line, so the file reads and diffs line by line; every value is written by the
    // JSON library.
    f << "{\"displayTimeUnit\":\"ms\",\"otherData\":" << dump(other) << ",\"traceEvents\":[\n";
    for (size_t i = 0; i < events.size(); ++i) f << (i ? ",\n" : "") << dump(events[i]);
    f << "\n]}\n";
    f.flush();
    TR_CHECK(f.good(), who_, ": writing the timeline to '", tmp, "' failed");
  }
  std::filesystem::rename(tmp, path_);
  dirty_ = false;
}

}  // namespace trainrun::plugins::ring_strategy
