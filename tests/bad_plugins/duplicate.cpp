// Two builds of this file share the plugin name "bad-duplicate" but offer differently named
// callbacks (DUP_COMPONENT_NAME), so a test can see which copy won.
#include <trainrun/trainrun.hpp>

namespace {
class NoopCallback : public trainrun::v1::Callback {
 public:
  static void declare_options(trainrun::v1::OptionSchema&) {}
  NoopCallback(const trainrun::v1::Options&, const trainrun::v1::RunContext&) {}
};
}  // namespace

TRAINRUN_PLUGIN("bad-duplicate", "0.0.1",
                trainrun::v1::component<trainrun::v1::Callback, NoopCallback>(
                    DUP_COMPONENT_NAME, "test callback that does nothing"));
