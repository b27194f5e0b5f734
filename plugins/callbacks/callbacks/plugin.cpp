// Entry symbol of the "callbacks" plugin. Compiled into callbacks-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "callbacks.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("callbacks", "0.1.0",
                trainrun::v1::component<trainrun::v1::Callback,
                                        trainrun::plugins::MetricsCallback>(
                    "metrics", "writes <run_dir>/metrics.jsonl, one JSON object per logged step"),
                trainrun::v1::component<trainrun::v1::Callback,
                                        trainrun::plugins::ProgressCallback>(
                    "progress", "single-line progress bar with ETA on a terminal (rank 0)"),
                trainrun::v1::component<trainrun::v1::Callback,
                                        trainrun::plugins::CheckpointCallback>(
                    "checkpoint", "when to write checkpoints (steps, minutes, signal, end) and how many to keep"))
