// Entry symbol of the "mpi" plugin. Its components are compiled once into an object
// library that the plugin and its unit tests share; only the plugin gets this file, since every
// plugin's entry symbol has the same name.
#include "mpi.hpp"
#include "trainrun/plugin.hpp"

TRAINRUN_PLUGIN("mpi", "0.1.0",
                trainrun::v1::component<trainrun::v1::Accelerator,
                                        trainrun::plugins::MpiAccelerator>(
                    "mpi", "the host CPU with collectives over MPI (MPICH); run the ranks with "
                           "mpiexec"))
