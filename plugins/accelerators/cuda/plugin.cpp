// Entry symbol of the "cuda" plugin (accelerator `cuda`, whose communicator is NCCL or Gloo
// via host memory). Compiled into cuda-objects beside cuda.cpp and nccl.cpp; the entry is weak
// there, so the tests that link the objects link; see trainrun_add_plugin_objects.
#include "cuda.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("cuda", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::cuda::CudaAccelerator>(
                    "cuda",
                    "one CUDA device per rank with an NCCL communicator (every op on its own "
                    "stream, watchdog + ncclCommAbort on timeout), or Gloo via host memory"))
