#pragma once
// Callback component `profiler`: where a step's time goes, operator by operator.
#include <trainrun/interfaces.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace trainrun::plugins {

/// One operator of a profile, aggregated over its calls with the same input shapes.
struct ProfiledOp {
  std::string name;                          ///< "aten::mm", "MmBackward0", ...
  std::vector<std::vector<int64_t>> shapes;  ///< input shapes (scalars and lists: [])
  int64_t calls = 0;
  double self_us = 0;   ///< wall time inside the operator but not inside an operator it called
  double total_us = 0;  ///< wall time inside the operator, callees included
  double flops = 0;     ///< matrix-product FLOPs of the calls (matrix_product_flops), or 0
};

/// Floating-point operations of one call of a matrix product, 2 M K N per product, from its
/// input shapes: aten::mm [M,K]x[K,N]; aten::addmm (bias, [M,K], [K,N]); aten::bmm
/// [B,M,K]x[B,K,N]; aten::baddbmm (bias, [B,M,K], [B,K,N]). 0 for any other operator or shapes
/// that do not fit (then the operator is not counted as a matrix product).
double matrix_product_flops(const std::string& name,
                            const std::vector<std::vector<int64_t>>& shapes);

/// Times every operator LibTorch runs during steps [start_step, start_step + num_steps) with a
/// RecordFunction observer (the hook torch.profiler is built on; input shapes recorded for the
/// matrix products only, which keeps the observer's cost to a few per cent of a step, or for
/// every operator with all_shapes), from the end of step start_step - 1 to the end of the last
/// profiled step: the same span as the wall time between two metrics lines, data loading and other
/// callbacks included. At the end it writes <run_dir>/<filename>: {"rank", "steps": [first, last],
/// "wall_s", "ops": [ProfiledOp as an object, by self time, largest first]} (rank 0, or every rank
/// with all_ranks). Operators of other threads (a collective backend's, the autograd engine's) are
/// included. Only the first profiler of a process records.
class ProfilerCallback final : public v1::Callback {
 public:
  static void declare_options(v1::OptionSchema& schema);
  ProfilerCallback(const v1::Options& options, const v1::RunContext& ctx);
  ~ProfilerCallback() override;
  void on_train_start(const v1::TrainPlan& plan) override;
  void on_step_end(const v1::StepMetrics& m) override;
  void on_train_end(const v1::TrainSummary& summary) override;

 private:
  void start();
  void stop(int64_t last_step);
  int64_t start_step_;
  int64_t num_steps_;
  bool all_shapes_;
  std::string path_;  ///< "" on a rank that writes nothing
  bool active_ = false;
  bool done_ = false;
  double wall0_ = 0;     ///< microseconds, steady clock
  uint64_t handle_ = 0;  ///< the RecordFunction observer, while active_
};

}  // namespace trainrun::plugins
