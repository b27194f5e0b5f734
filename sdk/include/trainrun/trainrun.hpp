#pragma once
// Umbrella header for plugin authors.
#include "trainrun/error.hpp"
#include "trainrun/interfaces.hpp"
#include "trainrun/log.hpp"
#include "trainrun/objective.hpp"
#include "trainrun/model/module_model.hpp"
#include "trainrun/optim/lr_schedule.hpp"
#include "trainrun/options.hpp"
#include "trainrun/plugin.hpp"
#include "trainrun/reward.hpp"
#include "trainrun/strategy/strategy_helpers.hpp"
#include "trainrun/types.hpp"
#include "trainrun/unit.hpp"
