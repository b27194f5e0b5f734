// Entry symbol of the "mpi" plugin. Compiled into mpi-objects with the components
// (one unit with them): the entry is weak there, so the tests that link several plugins' objects
// link; see trainrun_add_plugin_objects in the top-level CMakeLists.txt.
#include "mpi.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("mpi", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::MpiAccelerator>(
                    "mpi", "the host CPU with collectives over MPI (MPICH); run the ranks with "
                           "mpiexec"))
