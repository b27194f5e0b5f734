// Entry symbol of the "optim" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "optim.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("optim", "0.1.0",
                trainrun::v1::component<trainrun::v1::Optimizer, trainrun::plugins::Sgd>(
                    "sgd", "stochastic gradient descent with momentum/Nesterov (torch.optim.SGD)"),
                trainrun::v1::component<trainrun::v1::Optimizer, trainrun::plugins::AdamW>(
                    "adamw", "Adam with decoupled weight decay (torch.optim.AdamW)"))
