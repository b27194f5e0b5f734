// Entry symbol of the "chat" plugin; the component lives in chat.cpp.
#include "trainrun/plugin.hpp"

namespace trainrun::chat {
extern const trainrun_component_v1 kComponents[];
}

TRAINRUN_PLUGIN("chat", "0.1.0", trainrun::chat::kComponents[0])
