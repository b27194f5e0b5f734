// Entry symbol of the "callbacks" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
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
