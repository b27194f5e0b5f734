// Entry symbol of the "cuda" plugin (accelerator `cuda`, whose communicator is NCCL or Gloo via
// host memory). Only the plugin gets this file; its unit tests link cuda-objects.
#include "cuda.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("cuda", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::cuda::CudaAccelerator>(
                    "cuda",
                    "one CUDA device per rank with an NCCL communicator (every op on its own "
                    "stream, watchdog + ncclCommAbort on timeout), or Gloo via host memory"))
