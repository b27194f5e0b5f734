// Entry symbol of the "tensorboard" plugin (its components are compiled into tensorboard-objects,
// which the unit tests link too).
#include "tensorboard.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("tensorboard", "0.1.0",
                trainrun::v1::component<trainrun::v1::Callback,
                                        trainrun::plugins::TensorBoardCallback>(
                    "tensorboard",
                    "writes <run_dir>/tb/ TensorBoard event files: every metric as a scalar, the job as text"))
