// An ordinary plugin that needs a shared library which is never there: it is linked against
// tests/bad_plugins/dep.cpp's library, whose SONAME (libtrainrun-test-absent.so) differs from its
// file name, so the plugin's DT_NEEDED names a file that exists nowhere and loading it fails on
// the missing dependency.
#include <trainrun/trainrun.hpp>

#include <string>

#include "tiny_model.hpp"

extern "C" int trainrun_test_dep_answer(void);

namespace {
class DepModel : public trainrun_test::TinyModel {
 public:
  using TinyModel::TinyModel;
  std::string describe() const override {
    return "tiny model with a dependency (" + std::to_string(trainrun_test_dep_answer()) + ")";
  }
};
}  // namespace

TRAINRUN_PLUGIN("bad-missing-dep", "0.0.1",
                trainrun::v1::component<trainrun::v1::Model, DepModel>(
                    "missing-dep-net", "test model in a plugin whose dependency is missing"));
