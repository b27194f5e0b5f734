// Entry symbol of the "data" plugin; the components live in data.cpp.
#include "trainrun/plugin.hpp"

namespace trainrun::data {
extern const trainrun_component_v1 kComponents[];
}

TRAINRUN_PLUGIN("data", "0.1.0", trainrun::data::kComponents[0], trainrun::data::kComponents[1])
