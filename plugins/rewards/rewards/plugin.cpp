// Entry symbol of the "rewards" plugin (weak in rewards-objects; see trainrun_add_plugin_objects in
// the top-level CMakeLists.txt).
#include "rewards.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("rewards", "0.1.0",
                trainrun::v1::component<trainrun::v1::Reward, trainrun::plugins::AccuracyReward>(
                    "accuracy",
                    "1 when the completion's answer equals the row's reference field, else 0"),
                trainrun::v1::component<trainrun::v1::Reward, trainrun::plugins::FormatReward>(
                    "format", "1 when a regex matches the completion, else 0"),
                trainrun::v1::component<trainrun::v1::Reward, trainrun::plugins::LengthReward>(
                    "length", "a length penalty: DAPO's soft overlong punishment or a linear one"),
                trainrun::v1::component<trainrun::v1::Reward, trainrun::plugins::CommandReward>(
                    "command",
                    "a program of yours scores each completion (JSON lines in, numbers out)"))
