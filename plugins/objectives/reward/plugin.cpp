// Entry symbol of the "reward" plugin (weak in reward-objects; see trainrun_add_plugin_objects in
// the top-level CMakeLists.txt).
#include "trainrun/plugin.hpp"

namespace trainrun::reward {
extern const trainrun_component_v1 kComponents[1];
}

TRAINRUN_PLUGIN("reward", "0.1.0", trainrun::reward::kComponents[0])
