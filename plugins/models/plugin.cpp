// Entry symbol of the "models" plugin; the components live in models.cpp.
#include "trainrun/plugin.hpp"

namespace trainrun::models {
extern const trainrun_component_v1 kComponents[];
}

TRAINRUN_PLUGIN("models", "0.1.0", trainrun::models::kComponents[0],
                trainrun::models::kComponents[1], trainrun::models::kComponents[2],
                trainrun::models::kComponents[3])
