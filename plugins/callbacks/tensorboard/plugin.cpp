// Entry symbol of the "tensorboard" plugin. Compiled into tensorboard-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "tensorboard.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("tensorboard", "0.1.0",
                trainrun::v1::component<trainrun::v1::Callback,
                                        trainrun::plugins::TensorBoardCallback>(
                    "tensorboard",
                    "writes <run_dir>/tb/ TensorBoard event files: every metric as a scalar, the job as text"))
