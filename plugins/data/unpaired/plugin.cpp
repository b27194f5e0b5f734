// Entry symbol of the "unpaired" plugin. Compiled into unpaired-objects with the component (one
// unit with it): the entry is weak there, so tests that link several plugins' objects link; see
// trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "trainrun/plugin.hpp"

namespace trainrun::unpaired {
extern const trainrun_component_v1 kComponents[];
}

TRAINRUN_PLUGIN("unpaired", "0.1.0", trainrun::unpaired::kComponents[0])
