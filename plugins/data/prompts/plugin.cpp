// Entry symbol of the "prompts" plugin. Compiled into prompts-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "trainrun/plugin.hpp"

namespace trainrun::prompts {
extern const trainrun_component_v1 kComponents[];
}

TRAINRUN_PLUGIN("prompts", "0.1.0", trainrun::prompts::kComponents[0])
