// Entry symbol of the "optim" plugin. Compiled into optim-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "optim.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("optim", "0.1.0",
                trainrun::v1::component<trainrun::v1::Optimizer, trainrun::plugins::Sgd>(
                    "sgd", "stochastic gradient descent with momentum/Nesterov (torch.optim.SGD)"),
                trainrun::v1::component<trainrun::v1::Optimizer, trainrun::plugins::AdamW>(
                    "adamw", "Adam with decoupled weight decay (torch.optim.AdamW)"))
