// Worker-environment detection (launcher.hpp): who this process is in the job, from the
// variables torchrun, SLURM, Open MPI or MPICH set, and the path of this executable.
#include "trainrun/core/launcher.hpp"

#include <trainrun/error.hpp>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <optional>
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

}  // namespace

WorkerEnvironment detect_worker_environment() {
  WorkerEnvironment w;
  w.agent_store = env_value("TRAINRUN_AGENT_STORE").value_or("") == "1";
  w.run_dir_ready = env_value("TRAINRUN_RUN_DIR_READY").value_or("") == "1";

  // Variable names of the source found, for messages about inconsistent values.
  const char *rank_var = nullptr, *size_var = nullptr, *lrank_var = nullptr, *lsize_var = nullptr;
  std::optional<int> local_rank, local_size;
  if (auto r = env_value("RANK"); r && !r->empty()) {
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

std::string self_executable() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot read /proc/self/exe: " + ec.message());
  return p.string();
}

}  // namespace trainrun::core
