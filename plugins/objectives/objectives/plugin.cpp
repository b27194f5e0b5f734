// Entry symbol of the "objectives" plugin. Compiled into objectives-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "trainrun/plugin.hpp"

namespace trainrun::objectives {
extern const trainrun_component_v1 kComponents[5];
}

TRAINRUN_PLUGIN("objectives", "0.1.0", trainrun::objectives::kComponents[0],
                trainrun::objectives::kComponents[1], trainrun::objectives::kComponents[2],
                trainrun::objectives::kComponents[3], trainrun::objectives::kComponents[4])
