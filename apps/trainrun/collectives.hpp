#pragma once
// `trainrun bench collectives`: bandwidth table and correctness matrix of a collective backend.

namespace trainrun::app {
/// Runs `trainrun bench collectives ...` (argv as main received it). Returns the exit code:
/// 0 ok, 1 a check failed or an operation failed, 2 bad arguments or plugin.
int run_bench_command(int argc, char** argv);
}  // namespace trainrun::app
