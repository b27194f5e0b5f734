// Entry symbol of the "preference" plugin. Compiled into preference-objects with the component
// (one unit with it): the entry is weak there, so tests that link several plugins' objects link;
// see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "trainrun/plugin.hpp"

namespace trainrun::preference {
extern const trainrun_component_v1 kComponents[];
}

TRAINRUN_PLUGIN("preference", "0.1.0", trainrun::preference::kComponents[0])
