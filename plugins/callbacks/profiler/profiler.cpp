#include "profiler.hpp"

#include <trainrun/error.hpp>
#include <trainrun/options.hpp>

#include <nlohmann/json.hpp>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

namespace trainrun::plugins {

using namespace trainrun::v1;
namespace fs = std::filesystem;

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using OpKey = std::pair<std::string, std::vector<std::vector<int64_t>>>;

// What the RecordFunction observer collects while a profile runs. RecordFunction scopes nest
// on a thread, so a per-thread stack gives each operator's callees' time; the aggregates of all
// threads go into one map under a mutex (taken once per operator end: microseconds against
// operators that take tens of microseconds or more).
struct Recording {
  bool all_shapes = false;  ///< the option all_shapes; set before the observer is added
  std::mutex mutex;
  std::map<OpKey, ProfiledOp> ops;
};
std::atomic<Recording*> g_recording{nullptr};

struct Frame {
  double t0_us;
  double children_us;
};
thread_local std::vector<Frame> t_stack;

bool is_matrix_product(const char* name) {
  return std::strcmp(name, "aten::mm") == 0 || std::strcmp(name, "aten::addmm") == 0 ||
         std::strcmp(name, "aten::bmm") == 0 || std::strcmp(name, "aten::baddbmm") == 0;
}

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction&) {
  t_stack.push_back({now_us(), 0.0});
  return nullptr;
}

void on_op_end(const at::RecordFunction& fn, at::ObserverContext*) {
  // An operator that began before the profile started (a step's outer scope) has no frame.
  if (t_stack.empty()) return;
  const Frame f = t_stack.back();
  t_stack.pop_back();
  const double total = now_us() - f.t0_us;
  if (!t_stack.empty()) t_stack.back().children_us += total;
  Recording* rec = g_recording.load();
  if (rec == nullptr) return;
  const char* name = fn.name();
  std::vector<std::vector<int64_t>> shapes;
  // Shapes only for the matrix products: their FLOPs need them, and the other operators'
  // shapes would cost more to record than many of those operators take.
  if (rec->all_shapes || is_matrix_product(name))
    for (const c10::IValue& v : fn.inputs())
      shapes.push_back(v.isTensor() ? v.toTensor().sizes().vec() : std::vector<int64_t>{});
  std::lock_guard<std::mutex> lock(rec->mutex);
  ProfiledOp& op = rec->ops[{name, shapes}];
  if (op.calls == 0) {
    op.name = name;
    op.shapes = shapes;
  }
  op.calls += 1;
  op.total_us += total;
  op.self_us += std::max(0.0, total - f.children_us);
  op.flops += matrix_product_flops(name, shapes);
}

}  // namespace

double matrix_product_flops(const std::string& name, const std::vector<std::vector<int64_t>>& s) {
  auto mm = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    return a.size() == 2 && b.size() == 2 && a[1] == b[0]
               ? 2.0 * static_cast<double>(a[0]) * static_cast<double>(a[1]) *
                     static_cast<double>(b[1])
               : 0.0;
  };
  auto bmm = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    return a.size() == 3 && b.size() == 3 && a[0] == b[0] && a[2] == b[1]
               ? 2.0 * static_cast<double>(a[0]) * static_cast<double>(a[1]) *
                     static_cast<double>(a[2]) * static_cast<double>(b[2])
               : 0.0;
  };
  if (name == "aten::mm" && s.size() >= 2) return mm(s[0], s[1]);
  if (name == "aten::addmm" && s.size() >= 3) return mm(s[1], s[2]);
  if (name == "aten::bmm" && s.size() >= 2) return bmm(s[0], s[1]);
  if (name == "aten::baddbmm" && s.size() >= 3) return bmm(s[1], s[2]);
  return 0.0;
}

void ProfilerCallback::declare_options(OptionSchema& schema) {
  schema.integer("start_step", 3,
                 "first optimizer step profiled (1-based; the default leaves two warm-up steps "
                 "out)",
                 1.0);
  schema.integer("num_steps", 1, "how many consecutive steps are profiled", 1.0);
  schema.string("filename", "profile-rank-{rank}.json",
                "file name, relative to the run directory; {rank} becomes the rank");
  schema.boolean("all_ranks", false, "every rank writes its profile; otherwise rank 0 only");
  schema.boolean("all_shapes", false,
                 "record every operator's input shapes, not only the matrix products' (slower: "
                 "the profiled step takes longer, the split stays close)");
}

ProfilerCallback::ProfilerCallback(const Options& options, const RunContext& ctx)
    : start_step_(options.get_int("start_step")),
      num_steps_(options.get_int("num_steps")),
      all_shapes_(options.get_bool("all_shapes")) {
  TR_CHECK_TYPED(ConfigError, start_step_ >= 1, options.context(),
                 ": start_step must be >= 1, got ", start_step_);
  TR_CHECK_TYPED(ConfigError, num_steps_ >= 1, options.context(), ": num_steps must be >= 1, got ",
                 num_steps_);
  std::string name = options.get_string("filename");
  TR_CHECK_TYPED(ConfigError, !name.empty(), options.context(), ": filename must not be empty");
  if (!options.get_bool("all_ranks") && ctx.rank != 0) return;
  if (const auto at = name.find("{rank}"); at != std::string::npos)
    name.replace(at, 6, std::to_string(ctx.rank));
  path_ = (fs::path(ctx.run_dir) / name).string();
}

ProfilerCallback::~ProfilerCallback() {
  // A run that stopped inside the profiled steps: the observer goes, nothing is written (the
  // steps are not whole).
  if (active_) {
    at::removeCallback(handle_);
    delete g_recording.exchange(nullptr);
  }
}

void ProfilerCallback::start() {
  if (path_.empty() || active_ || done_) return;
  // One observer per process: a second profiler callback in the same job does not start.
  Recording* expected = nullptr;
  auto rec = std::make_unique<Recording>();
  rec->all_shapes = all_shapes_;
  if (!g_recording.compare_exchange_strong(expected, rec.get())) return;
  rec.release();
  handle_ = at::addGlobalCallback(
      at::RecordFunctionCallback(&on_op_start, &on_op_end)
          .needsInputs(true)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::BACKWARD_FUNCTION}));
  active_ = true;
  wall0_ = now_us();
}

void ProfilerCallback::stop(int64_t last_step) {
  if (!active_) return;
  const double wall = (now_us() - wall0_) / 1e6;
  at::removeCallback(handle_);
  // Operators still running on other threads may be inside on_op_end: take the lock once
  // more, then the map is this thread's alone.
  std::unique_ptr<Recording> rec(g_recording.exchange(nullptr));
  { std::lock_guard<std::mutex> lock(rec->mutex); }
  active_ = false;
  done_ = true;
  std::vector<const ProfiledOp*> sorted;
  for (const auto& [key, op] : rec->ops) sorted.push_back(&op);
  std::sort(sorted.begin(), sorted.end(),
            [](const ProfiledOp* a, const ProfiledOp* b) { return a->self_us > b->self_us; });
  nlohmann::ordered_json j;
  j["steps"] = {last_step - num_steps_ + 1, last_step};
  j["wall_s"] = wall;
  j["ops"] = nlohmann::ordered_json::array();
  for (const ProfiledOp* op : sorted)
    j["ops"].push_back({{"name", op->name},
                        {"shapes", op->shapes},
                        {"calls", op->calls},
                        {"self_us", op->self_us},
                        {"total_us", op->total_us},
                        {"flops", op->flops}});
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
  std::ofstream out(path_);
  TR_CHECK(out.is_open(), "profiler: cannot write '", path_, "'");
  out << j.dump(1) << '\n';
}

void ProfilerCallback::on_train_start(const TrainPlan&) {
  if (start_step_ == 1) start();
}

void ProfilerCallback::on_step_end(const StepMetrics& m) {
  if (m.step == start_step_ - 1) start();
  if (m.step == start_step_ + num_steps_ - 1) stop(m.step);
}

void ProfilerCallback::on_train_end(const TrainSummary& summary) {
  // Fewer steps than asked for: what was recorded is still one whole span of steps.
  if (active_) {
    num_steps_ = summary.steps - start_step_ + 1;
    stop(summary.steps);
  }
}

}  // namespace trainrun::plugins
