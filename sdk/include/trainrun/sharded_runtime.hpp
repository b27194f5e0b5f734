#pragma once
// Deprecated: this path forwards to the header's new place (issue 42, ABI 1.7), kept for one ABI
// minor so that plugins including the old path still compile; to be removed after ABI 1.8.
#include "trainrun/strategy/sharded_runtime.hpp"
