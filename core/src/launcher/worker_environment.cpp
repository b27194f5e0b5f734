// Worker-environment detection (launcher.hpp): who this process is in the job, from the
// variables torchrun, SLURM, Open MPI or MPICH set, and the path of this executable.
#include "trainrun/core/launcher.hpp"

#include <trainrun/error.hpp>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace trainrun::core {

using v1::ConfigError;
using v1::Error;

// ---------------------------------------------------------------------------------------------
// Worker environment

namespace {

std::optional<std::string> env_value(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

int env_int(const char* name, const std::string& value) {
  int out = -1;
  const char* b = value.data();
  const char* e = b + value.size();
  auto [p, ec] = std::from_chars(b, e, out);
  if (value.empty() || ec != std::errc() || p != e || out < 0)
    throw ConfigError("environment variable " + std::string(name) + "='" + value +
                      "' is not a non-negative integer");
  return out;
}

// `name` must be set when `because` is; returns its value.
int required_int(const char* name, const char* because) {
  auto v = env_value(name);
  if (!v)
    throw ConfigError(std::string("environment variable ") + because + " is set but " + name +
                      " is not; a launcher sets both");
  return env_int(name, *v);
}

std::optional<int> optional_int(const char* name) {
  auto v = env_value(name);
  if (!v || v->empty()) return std::nullopt;
  return env_int(name, *v);
}

// SLURM_TASKS_PER_NODE is "2(x3),1": 2 tasks on each of three nodes, then 1. Returns the count of
// node `node` (or of the first node when the list is shorter, as for a step on fewer nodes).
int slurm_tasks_on_node(const std::string& text, int node) {
  std::vector<int> counts;
  std::stringstream ss(text);
  for (std::string field; std::getline(ss, field, ',');) {
    int n = 0, repeat = 1;
    const size_t paren = field.find('(');
    try {
      n = env_int("SLURM_TASKS_PER_NODE", field.substr(0, paren));
      if (paren != std::string::npos) {
        if (field.size() < paren + 4 || field.compare(paren, 2, "(x") != 0 || field.back() != ')')
          throw ConfigError("");
        repeat = env_int("SLURM_TASKS_PER_NODE", field.substr(paren + 2, field.size() - paren - 3));
      }
    } catch (const ConfigError&) {
      throw ConfigError("environment variable SLURM_TASKS_PER_NODE='" + text +
                        "' is not a task list such as \"2(x3),1\"");
    }
    for (int i = 0; i < repeat && counts.size() < 1000000; ++i) counts.push_back(n);
  }
  if (counts.empty())
    throw ConfigError("environment variable SLURM_TASKS_PER_NODE is empty");
  return node >= 0 && node < static_cast<int>(counts.size()) ? counts[node] : counts.front();
}

// A pod of a Kubeflow PyTorchJob (training operator): the operator sets RANK and WORLD_SIZE for
// the pod (RANK = its node index) and PET_NODE_RANK for torchrun, which would then set
// LOCAL_RANK in each worker. Such a process is a node agent, not a worker.
bool kubeflow_pod() {
  const auto node = env_value("PET_NODE_RANK");
  const auto local = env_value("LOCAL_RANK");
  return node && !node->empty() && (!local || local->empty());
}

}  // namespace

std::optional<ClusterLaunch> cluster_launch_from_environment() {
  if (!kubeflow_pod()) return std::nullopt;
  ClusterLaunch c;
  c.source = "Kubeflow PyTorchJob";
  const int node_rank = env_int("PET_NODE_RANK", *env_value("PET_NODE_RANK"));
  std::optional<int> nproc;
  if (auto v = env_value("PET_NPROC_PER_NODE"); v && !v->empty()) {
    // "auto" / "gpu" let torchrun decide; here the job file's nproc_per_node does.
    if (v->find_first_not_of("0123456789") == std::string::npos) nproc = env_int("PET_NPROC_PER_NODE", *v);
    else c.notes.push_back("PET_NPROC_PER_NODE='" + *v + "' is not a number: [launch] nproc_per_node is used");
  }
  int nnodes = 0;
  if (auto v = env_value("PET_NNODES"); v && !v->empty()) {
    if (v->find(':') != std::string::npos)
      throw ConfigError("environment variable PET_NNODES='" + *v + "' is a range (an elastic "
                        "PyTorchJob): trainrun runs a fixed number of nodes; give the job a "
                        "fixed replica count without elasticPolicy");
    nnodes = env_int("PET_NNODES", *v);
  } else if (auto w = optional_int("WORLD_SIZE")) {
    nnodes = *w / std::max(1, nproc.value_or(1));  // the operator's WORLD_SIZE = pods x nproc
  } else {
    throw ConfigError("environment: PET_NODE_RANK is set but neither PET_NNODES nor WORLD_SIZE "
                      "is; a PyTorchJob sets both");
  }
  if (nnodes < 1 || node_rank >= nnodes)
    throw ConfigError("environment: PET_NODE_RANK=" + std::to_string(node_rank) +
                      " is not below the number of nodes " + std::to_string(nnodes) +
                      " (PET_NNODES, or WORLD_SIZE / PET_NPROC_PER_NODE)");
  const char* addr_var = env_value("PET_MASTER_ADDR") ? "PET_MASTER_ADDR" : "MASTER_ADDR";
  const char* port_var = env_value("PET_MASTER_PORT") ? "PET_MASTER_PORT" : "MASTER_PORT";
  const auto addr = env_value(addr_var);
  if (!addr || addr->empty())
    throw ConfigError("environment: PET_NODE_RANK is set but MASTER_ADDR is not; a PyTorchJob "
                      "sets it to the master pod's service");
  c.launch.emplace_back("nnodes", std::to_string(nnodes));
  c.launch.emplace_back("node_rank", std::to_string(node_rank));
  if (nproc) c.launch.emplace_back("nproc_per_node", std::to_string(*nproc));
  c.launch.emplace_back("master_addr", *addr);
  if (auto port = env_value(port_var); port && !port->empty())
    c.launch.emplace_back("master_port", std::to_string(env_int(port_var, *port)));
  return c;
}

WorkerEnvironment detect_worker_environment() {
  WorkerEnvironment w;
  w.agent_store = env_value("TRAINRUN_AGENT_STORE").value_or("") == "1";
  w.run_dir_ready = env_value("TRAINRUN_RUN_DIR_READY").value_or("") == "1";

  // Variable names of the source found, for messages about inconsistent values.
  const char *rank_var = nullptr, *size_var = nullptr, *lrank_var = nullptr, *lsize_var = nullptr;
  std::optional<int> local_rank, local_size;
  if (auto r = env_value("RANK"); r && !r->empty() && !kubeflow_pod()) {
    w.source = "trainrun/torchrun";
    rank_var = "RANK", size_var = "WORLD_SIZE", lrank_var = "LOCAL_RANK",
    lsize_var = "LOCAL_WORLD_SIZE";
    w.node_rank = optional_int("GROUP_RANK").value_or(0);
  } else if (auto p = env_value("PMI_RANK"); p && !p->empty()) {
    w.source = "mpiexec (PMI)";
    rank_var = "PMI_RANK", size_var = "PMI_SIZE", lrank_var = "MPI_LOCALRANKID",
    lsize_var = "MPI_LOCALNRANKS";
  } else if (auto o = env_value("OMPI_COMM_WORLD_RANK"); o && !o->empty()) {
    w.source = "Open MPI";
    rank_var = "OMPI_COMM_WORLD_RANK", size_var = "OMPI_COMM_WORLD_SIZE",
    lrank_var = "OMPI_COMM_WORLD_LOCAL_RANK", lsize_var = "OMPI_COMM_WORLD_LOCAL_SIZE";
  } else if (auto s = env_value("SLURM_PROCID"); s && !s->empty()) {
    w.source = "SLURM";
    rank_var = "SLURM_PROCID", size_var = env_value("SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
    lrank_var = "SLURM_LOCALID";
    w.node_rank = optional_int("SLURM_NODEID").value_or(0);
    if (auto n = optional_int("SLURM_NTASKS_PER_NODE")) {
      local_size = *n;
      lsize_var = "SLURM_NTASKS_PER_NODE";
    } else if (auto t = env_value("SLURM_TASKS_PER_NODE"); t && !t->empty()) {
      local_size = slurm_tasks_on_node(*t, w.node_rank);
      lsize_var = "SLURM_TASKS_PER_NODE";
    }
  } else {
    return w;
  }
  w.is_worker = true;
  w.rank = env_int(rank_var, *env_value(rank_var));
  w.world_size = required_int(size_var, rank_var);
  local_rank = optional_int(lrank_var);
  if (!local_size && lsize_var) local_size = optional_int(lsize_var);
  // Without the local variables, the launcher is taken to run every rank on this node.
  w.local_rank = local_rank.value_or(w.rank);
  w.local_world_size = local_size.value_or(w.world_size);
  const std::string lsize_name = lsize_var ? lsize_var : size_var;
  auto bad = [](const std::string& what) { return ConfigError("environment: " + what); };
  if (w.world_size < 1) throw bad(std::string(size_var) + "=0: the world needs at least one rank");
  if (w.rank >= w.world_size)
    throw bad(std::string(rank_var) + "=" + std::to_string(w.rank) + " is not below " + size_var +
              "=" + std::to_string(w.world_size));
  if (w.local_world_size < 1 || w.local_world_size > w.world_size)
    throw bad(lsize_name + "=" + std::to_string(w.local_world_size) + " must be in [1, " +
              size_var + "=" + std::to_string(w.world_size) + "]");
  if (w.local_rank >= w.local_world_size)
    throw bad(std::string(local_rank ? lrank_var : rank_var) + "=" + std::to_string(w.local_rank) +
              " is not below " + lsize_name + "=" + std::to_string(w.local_world_size));
  return w;
}

std::optional<std::string> restart_of_this_job() {
  if (auto t = env_value("TRAINRUN_RESTART"); t && !t->empty())
    return "restart " + std::to_string(env_int("TRAINRUN_RESTART", *t));
  // SLURM counts the times it started the batch job again (requeue or node failure); srun
  // passes the variable on to every task. 0 or unset: the first run.
  if (auto n = optional_int("SLURM_RESTART_COUNT"); n && *n > 0)
    return "SLURM requeue " + std::to_string(*n) + " (SLURM_RESTART_COUNT)";
  return std::nullopt;
}

std::string self_executable() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot read /proc/self/exe: " + ec.message());
  return p.string();
}

}  // namespace trainrun::core
