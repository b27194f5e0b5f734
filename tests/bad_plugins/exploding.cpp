// A valid plugin whose Model factory throws: the host must turn that into an error naming the
// plugin (exit code 2), not a crash.
#include <trainrun/trainrun.hpp>

#include <stdexcept>

#include "tiny_model.hpp"

namespace {
class ExplodingModel : public trainrun_test::TinyModel {
 public:
  static void declare_options(trainrun::v1::OptionSchema&) {}
  ExplodingModel(const trainrun::v1::Options& o, const trainrun::v1::RunContext& ctx)
      : TinyModel(o, ctx) {
    throw std::runtime_error("boom: weights file missing");
  }
};

// Throws something that is not a std::exception (C++ allows it; some libraries do it).
class ExplodingNonStdModel : public trainrun_test::TinyModel {
 public:
  static void declare_options(trainrun::v1::OptionSchema&) {}
  ExplodingNonStdModel(const trainrun::v1::Options& o, const trainrun::v1::RunContext& ctx)
      : TinyModel(o, ctx) {
    throw 42;
  }
};
}  // namespace

TRAINRUN_PLUGIN("bad-exploding", "0.0.1",
                trainrun::v1::component<trainrun::v1::Model, ExplodingModel>(
                    "exploding", "test model whose constructor throws"),
                trainrun::v1::component<trainrun::v1::Model, ExplodingNonStdModel>(
                    "exploding-nonstd", "test model whose constructor throws an int"));
