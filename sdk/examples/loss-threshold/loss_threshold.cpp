// The "loss-threshold" callback: reports (stdout and a small JSON file in the run directory) the
// first step at which the chosen loss drops below a threshold; optionally fails the run when it
// never does. Only rank 0 reports, so it behaves the same under every strategy.
#include <trainrun/trainrun.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>

namespace {

using trainrun::v1::ConfigError;
using trainrun::v1::EvalMetrics;
using trainrun::v1::Options;
using trainrun::v1::OptionSchema;
using trainrun::v1::OptionSpec;
using trainrun::v1::OptionType;
using trainrun::v1::RunContext;
using trainrun::v1::StepMetrics;
using trainrun::v1::TrainSummary;

class LossThreshold : public trainrun::v1::Callback {
 public:
  static void declare_options(OptionSchema& schema) {
    OptionSpec threshold;
    threshold.name = "threshold";
    threshold.type = OptionType::Float;
    threshold.required = true;
    threshold.min = 0.0;
    threshold.help = "report the first step at which the loss is below this value";
    schema.add(threshold);
    schema.choice("metric", "eval_loss", {"eval_loss", "train_loss"},
                  "which loss to watch: the evaluation loss, or the logged training loss");
    schema.string("filename", "loss-threshold.json",
                  "JSON file written when the threshold is reached, relative to the run "
                  "directory (\"\" = do not write)");
    schema.boolean("require", false, "fail the run at the end if the threshold was never reached");
  }

  LossThreshold(const Options& options, const RunContext& ctx)
      : threshold_(options.get_double("threshold")),
        metric_(options.get_string("metric")),
        require_(options.get_bool("require")),
        lead_(ctx.rank == 0) {
    TR_CHECK_TYPED(ConfigError, std::isfinite(threshold_), options.context(),
                   ": threshold must be a finite number");
    const std::string& filename = options.get_string("filename");
    if (!filename.empty()) path_ = (std::filesystem::path(ctx.run_dir) / filename).string();
  }

  void on_step_end(const StepMetrics& m) override {
    if (metric_ == "train_loss") observe(m.step, m.loss);
  }
  void on_eval_end(const EvalMetrics& m) override {
    if (metric_ == "eval_loss") observe(m.step, m.loss);
  }

  void on_train_end(const TrainSummary& summary) override {
    if (reached_ || !lead_) return;
    std::ostringstream os;
    os << "loss-threshold: " << metric_ << " never went below " << threshold_;
    if (std::isfinite(best_)) os << " (best " << best_ << " at step " << best_step_ << ")";
    else os << " (it was never measured)";
    os << " in " << summary.steps << " steps";
    if (require_) throw trainrun::v1::Error(os.str());
    std::cout << "[" << os.str() << "]" << std::endl;
  }

 private:
  void observe(int64_t step, double value) {
    if (!std::isfinite(value)) return;
    if (value < best_) best_ = value, best_step_ = step;
    if (reached_ || !(value < threshold_)) return;
    reached_ = true;
    if (!lead_) return;
    std::cout << "[loss-threshold: " << metric_ << " " << value << " < " << threshold_
              << " at step " << step << "]" << std::endl;
    if (path_.empty()) return;
    std::ofstream f(path_);
    f << "{\"metric\": \"" << metric_ << "\", \"threshold\": " << threshold_
      << ", \"value\": " << value << ", \"step\": " << step << "}\n";
    TR_CHECK(f.good(), "loss-threshold: cannot write '", path_, "'");
  }

  double threshold_;
  std::string metric_;
  bool require_;
  bool lead_;
  std::string path_;
  bool reached_ = false;
  double best_ = std::numeric_limits<double>::infinity();
  int64_t best_step_ = 0;
};

}  // namespace

TRAINRUN_PLUGIN("loss-threshold", "1.0.0",
                trainrun::v1::component<trainrun::v1::Callback, LossThreshold>(
                    "loss-threshold",
                    "reports the first step at which a loss drops below a threshold"));
