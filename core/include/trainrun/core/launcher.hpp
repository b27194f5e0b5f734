#pragma once
// The multi-process launcher (torchrun's role) and worker-environment detection.
//
// `trainrun --config job.toml` with [launch] nproc_per_node x nnodes > 1 becomes a node agent:
// node 0's agent serves the rendezvous store (c10d TCPStore) at master_addr:master_port, every
// agent registers there and checks the layout, then spawns its nproc_per_node workers (the same
// command line, with the torchrun environment set), prefixes their output with [rank N], copies
// it to <run_dir>/logs/rank-N.log, and supervises them: the first worker to fail (non-zero exit
// or signal) stops all others (SIGTERM, then SIGKILL after a grace period, longer for a worker
// that reports on fd 3 (TRAINRUN_CONTROL_FD) that it is writing a checkpoint) and is reported with
// how it failed and the last lines of its log. A process that already runs under a launcher
// (RANK set, mpiexec's PMI_RANK, Open MPI's OMPI_COMM_WORLD_RANK or SLURM's SLURM_PROCID) is a
// worker and spawns nothing.
//
// Output of the workers: each line goes to the launcher's stdout/stderr as "[rank N] line" and,
// unprefixed, to <run_dir>/logs/rank-N.log. When the launcher's stderr is a terminal, rank 0 gets
// TRAINRUN_TTY=1 (and COLUMNS) so its progress bar is drawn into the pipe; the launcher passes
// the bar's redraws through to the terminal, unprefixed and not logged. The launcher announces
// each worker on stderr ("trainrun: started rank N (pid P)"), which tests use to find them.
//
// Multi-node: every agent polls the store key job/failed; the first agent whose worker fails
// writes the cause there, and the others stop their workers and print it. Node 0's agent serves
// the store and stays until the other agents have ended (or their heartbeat stopped). With
// max_restarts, node 0 then opens the next round (trainrun/round; the workers get a store of
// their own per round) and every agent joins it; an agent started for a node_rank whose agent
// is gone (its host restarted) ends the running round and joins the next one.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace trainrun::core {

/// What the environment says about this process.
struct WorkerEnvironment {
  bool is_worker = false;    ///< started by a launcher (ours, mpiexec, SLURM, torchrun)
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;         ///< GROUP_RANK (torchrun), SLURM_NODEID; 0 where not given
  std::string source;        ///< "trainrun/torchrun", "mpiexec (PMI)", "Open MPI", "SLURM", ""
  bool agent_store = false;  ///< TRAINRUN_AGENT_STORE=1: the launcher serves the store
  bool run_dir_ready = false;  ///< TRAINRUN_RUN_DIR_READY=1: the agent already prepared run_dir
};

/// Reads, in this order of precedence (the first whose rank variable is set wins):
/// RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/GROUP_RANK (trainrun's agent, torchrun);
/// PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS (MPICH hydra);
/// OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (Open MPI);
/// SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NODEID, with the local size from
/// SLURM_NTASKS_PER_NODE or this node's entry of SLURM_TASKS_PER_NODE ("2(x3),1").
/// Missing local variables mean every rank is on this node. Throws ConfigError naming the
/// variable when a value is malformed or inconsistent (rank >= world_size, ...).
WorkerEnvironment detect_worker_environment();

/// Whether this run is a restart of an earlier attempt of the same job, which then continues
/// from the latest checkpoint when [trainer] resume is not set: TRAINRUN_RESTART=k (trainrun's
/// agent, [launch] max_restarts) or SLURM_RESTART_COUNT=k > 0 (a requeued batch job: `scontrol
/// requeue`, or a node failure with --requeue). Returns "restart k" / "SLURM requeue k
/// (SLURM_RESTART_COUNT)" for messages; nullopt for a first run. Throws ConfigError naming the
/// variable when its value is not a non-negative integer.
std::optional<std::string> restart_of_this_job();

/// The layout a cluster's job controller gives this node's agent through the environment.
struct ClusterLaunch {
  std::string source;  ///< "Kubeflow PyTorchJob"
  std::vector<std::pair<std::string, std::string>> launch;  ///< [launch] key -> value
  std::vector<std::string> notes;  ///< variables present but not used, and why
};

/// A Kubeflow PyTorchJob pod (PET_NODE_RANK set, LOCAL_RANK not: the training operator's
/// environment, before torchrun or trainrun's agent made workers of it): nnodes from PET_NNODES
/// (or WORLD_SIZE / PET_NPROC_PER_NODE: the operator's WORLD_SIZE counts pods x processes),
/// node_rank from PET_NODE_RANK, nproc_per_node from PET_NPROC_PER_NODE when it is a number,
/// master_addr/master_port from PET_MASTER_ADDR/PORT or MASTER_ADDR/PORT. The operator's RANK
/// is the pod's index, not a worker's rank: detect_worker_environment does not take such a
/// process for a worker. nullopt elsewhere. Throws ConfigError naming the variable for a
/// malformed value or an elastic job (PET_NNODES = "1:4").
std::optional<ClusterLaunch> cluster_launch_from_environment();

/// How to run the workers of this node.
struct LaunchSpec {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            ///< 0 = pick a free port (nnodes == 1 only)
  bool store_listen_all = false;  ///< the store listens on every interface, not master_addr's
                                  ///< ([launch] store_listen = "all")
  double rendezvous_timeout_s = 300;  ///< agents and workers must all arrive within this
  double grace_s = 5;             ///< SIGTERM -> SIGKILL delay when stopping workers ([launch] stop_grace_s)
  double save_timeout_s = 600;    ///< a stopping worker that said it is writing a checkpoint is
                                  ///< killed only this long after the save began ([launch] stop_save_timeout_s)
  std::string run_dir;            ///< logs go to <run_dir>/logs/rank-N.log; "" = no log files
  bool rotate_run_dir = false;    ///< node 0 moves an earlier run in run_dir aside first
  bool mpiexec = false;           ///< spawn through MPICH's mpiexec -prepend-rank (nnodes == 1)
  std::vector<std::string> argv;  ///< worker command line; argv[0] = the trainrun executable
  int max_restarts = 0;           ///< restarts of all workers after a failure (every node's, in
                                  ///< rounds through node 0's store); the workers see
                                  ///< TRAINRUN_RESTART=k and resume from `latest`
};

/// A node layout that cannot work: the [launch] key at fault and what is wrong with it.
struct LaunchLayoutProblem {
  std::string key;      ///< e.g. "node_rank"; the job validation points at its place in the file
  std::string message;  ///< "[launch] node_rank 2 must be less than nnodes 2"
};

/// The launch checks, in one place: node_rank in [0, nnodes), master_port a port and 0 only on
/// one node, the mpiexec launcher on one node only and without max_restarts, positive counts and
/// timeouts. Job validation (config.cpp, with the key's file:line) and launch() (for a spec
/// made by other means) both ask it; argv is not looked at. Returns nullopt for a good layout.
std::optional<LaunchLayoutProblem> launch_layout_problem(const LaunchSpec& spec);

/// Runs this node's workers to completion (single-threaded; installs SIGINT/SIGTERM/SIGCHLD
/// handlers for its duration and puts the previous ones back). Returns 0 when every worker exited 0; otherwise
/// stops the rest and returns the failing worker's exit code (128 + signal number when it was
/// killed by a signal); 130 when the launcher itself was interrupted (SIGINT/SIGTERM), after
/// every worker is gone. Throws ConfigError for a bad layout (before anything is spawned) and
/// Error when the rendezvous of the agents fails (port in use, a node that never arrives,
/// nnodes mismatch).
int launch(const LaunchSpec& spec);

/// The path of the running executable (/proc/self/exe).
std::string self_executable();

}  // namespace trainrun::core
