// Entry symbol of the "models" plugin. Compiled into models-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "trainrun/plugin.hpp"

namespace trainrun::models {
extern const trainrun_component_v1 kComponents[];
}

TRAINRUN_PLUGIN("models", "0.1.0", trainrun::models::kComponents[0],
                trainrun::models::kComponents[1], trainrun::models::kComponents[2],
                trainrun::models::kComponents[3])
