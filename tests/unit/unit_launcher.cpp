// Unit tests of the launcher's pure parts: worker-environment detection (torchrun, MPICH, Open
// MPI, SLURM), LaunchSpec checks, the [launch] validation and the trainer's reading of the
// environment.
//
// The same binary is the harness of the supervision tests (tests/e2e/launcher_supervision.sh):
//   unit_launcher --launch NPROC GRACE_S RUN_DIR|- [mpiexec] -- COMMAND [ARGS...]
// runs core::launch() with COMMAND as the worker, so the agent's supervision (failures, signals,
// stray children, output routing) is tested with small shell workers instead of training jobs.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "job_files.hpp"
#include "trainrun/core/config.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/trainer.hpp"

using namespace trainrun;
namespace fs = std::filesystem;
using test::registry;
using test::write_job;

namespace {

// Every variable detect_worker_environment() reads; each test starts with none of them set.
const char* const kVars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE", "TRAINRUN_AGENT_STORE", "TRAINRUN_RUN_DIR_READY", "MASTER_ADDR",
    "MASTER_PORT", "PET_NODE_RANK", "PET_NNODES", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR",
    "PET_MASTER_PORT"};

// Sets exactly `vars` among kVars for the life of the object, then restores what was there.
class Env {
 public:
  explicit Env(const std::map<std::string, std::string>& vars) {
    for (const char* k : kVars) {
      const char* v = std::getenv(k);
      saved_[k] = v ? std::optional<std::string>(v) : std::nullopt;
      unsetenv(k);
    }
    for (const auto& [k, v] : vars) setenv(k.c_str(), v.c_str(), 1);
  }
  ~Env() {
    for (const auto& [k, v] : saved_) {
      if (v) setenv(k.c_str(), v->c_str(), 1);
      else unsetenv(k.c_str());
    }
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

std::string detect_error(const std::map<std::string, std::string>& vars) {
  Env env(vars);
  try {
    core::detect_worker_environment();
  } catch (const v1::ConfigError& e) {
    return e.what();
  }
  FAIL("no error");
  return {};
}

const char* kJob = R"([trainer]
max_steps = 10
global_batch_size = 8

[model]
plugin = "mlp"
hidden = [16]

[data]
plugin = "idx"
)";

core::JobConfig validate(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return core::JobFile::load(write_job(text), overrides).validate(registry());
}

std::string validation_error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    validate(text, overrides);
  } catch (const v1::ConfigError& e) {
    return e.what();
  }
  FAIL("no error for job:\n" << text);
  return {};
}

}  // namespace

TEST_SUITE("environment") {
  TEST_CASE("no launcher: rank 0 of 1, not a worker") {
    Env env({});
    const auto w = core::detect_worker_environment();
    CHECK_FALSE(w.is_worker);
    CHECK(w.rank == 0);
    CHECK(w.world_size == 1);
    CHECK(w.source.empty());
  }

  TEST_CASE("trainrun's agent / torchrun") {
    Env env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
             {"GROUP_RANK", "1"}, {"TRAINRUN_AGENT_STORE", "1"}, {"TRAINRUN_RUN_DIR_READY", "1"}});
    const auto w = core::detect_worker_environment();
    CHECK(w.is_worker);
    CHECK(w.source == "trainrun/torchrun");
    CHECK(w.rank == 5);
    CHECK(w.world_size == 8);
    CHECK(w.local_rank == 1);
    CHECK(w.local_world_size == 4);
    CHECK(w.node_rank == 1);
    CHECK(w.agent_store);
    CHECK(w.run_dir_ready);
  }

  TEST_CASE("without local variables every rank is local") {
    Env env({{"RANK", "2"}, {"WORLD_SIZE", "3"}});
    const auto w = core::detect_worker_environment();
    CHECK(w.local_rank == 2);
    CHECK(w.local_world_size == 3);
    CHECK(w.node_rank == 0);
    CHECK_FALSE(w.agent_store);
  }

  TEST_CASE("MPICH hydra (PMI)") {
    Env env({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
    const auto w = core::detect_worker_environment();
    CHECK(w.source == "mpiexec (PMI)");
    CHECK(w.rank == 3);
    CHECK(w.world_size == 4);
    CHECK(w.local_rank == 1);
    CHECK(w.local_world_size == 2);
  }

  TEST_CASE("Open MPI") {
    Env env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"}});
    const auto w = core::detect_worker_environment();
    CHECK(w.source == "Open MPI");
    CHECK(w.world_size == 2);
    CHECK(w.local_world_size == 1);
  }

  TEST_CASE("SLURM: local size from SLURM_TASKS_PER_NODE at this node, or SLURM_NTASKS_PER_NODE") {
    {
      Env env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "0"},
               {"SLURM_NODEID", "2"}, {"SLURM_TASKS_PER_NODE", "3(x2),1"}});
      const auto w = core::detect_worker_environment();
      CHECK(w.source == "SLURM");
      CHECK(w.rank == 5);
      CHECK(w.world_size == 7);
      CHECK(w.node_rank == 2);
      CHECK(w.local_world_size == 1);
    }
    {
      Env env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
               {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}});
      CHECK(core::detect_worker_environment().local_world_size == 2);
    }
    {
      Env env({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
               {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_TASKS_PER_NODE", "garbage"}});
      CHECK(core::detect_worker_environment().local_world_size == 2);
    }
  }

  TEST_CASE("our agent's RANK wins over an outer launcher's variables") {
    Env env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
             {"PMI_RANK", "0"}, {"PMI_SIZE", "1"}});
    const auto w = core::detect_worker_environment();
    CHECK(w.source == "trainrun/torchrun");
    CHECK(w.rank == 1);
  }

  TEST_CASE("a Kubeflow PyTorchJob pod is a node agent; its workers are workers") {
    // The training operator's environment for worker-0 of a job with a master and one worker,
    // nprocPerNode 2: RANK is the pod's index and WORLD_SIZE counts pods x processes.
    const std::map<std::string, std::string> pod{
        {"MASTER_ADDR", "job-master-0"}, {"MASTER_PORT", "23456"}, {"WORLD_SIZE", "4"},
        {"RANK", "1"}, {"PET_NPROC_PER_NODE", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NNODES", "2"}};
    {
      Env env(pod);
      CHECK_FALSE(core::detect_worker_environment().is_worker);
      const auto c = core::cluster_launch_from_environment();
      REQUIRE(c);
      CHECK(c->source == "Kubeflow PyTorchJob");
      const std::vector<std::pair<std::string, std::string>> want{
          {"nnodes", "2"}, {"node_rank", "1"}, {"nproc_per_node", "2"},
          {"master_addr", "job-master-0"}, {"master_port", "23456"}};
      CHECK(c->launch == want);
    }
    {
      // Without PET_NNODES (older operators): WORLD_SIZE / PET_NPROC_PER_NODE nodes.
      auto older = pod;
      older.erase("PET_NNODES");
      Env env(older);
      const auto c = core::cluster_launch_from_environment();
      REQUIRE(c);
      CHECK(c->launch.front() == std::pair<std::string, std::string>{"nnodes", "2"});
    }
    {
      // What trainrun's agent (or torchrun) gives a worker in that pod: a worker.
      auto worker = pod;
      worker["RANK"] = "3";
      worker["LOCAL_RANK"] = "1";
      worker["LOCAL_WORLD_SIZE"] = "2";
      Env env(worker);
      CHECK_FALSE(core::cluster_launch_from_environment());
      const auto w = core::detect_worker_environment();
      CHECK(w.is_worker);
      CHECK(w.rank == 3);
      CHECK(w.local_rank == 1);
    }
    {
      auto elastic = pod;
      elastic["PET_NNODES"] = "1:4";
      Env env(elastic);
      CHECK_THROWS_WITH_AS(core::cluster_launch_from_environment(),
                           doctest::Contains("PET_NNODES='1:4' is a range"), v1::ConfigError);
    }
    {
      auto bad = pod;
      bad["PET_NODE_RANK"] = "2";
      Env env(bad);
      CHECK_THROWS_WITH_AS(core::cluster_launch_from_environment(),
                           doctest::Contains("PET_NODE_RANK=2 is not below the number of nodes 2"),
                           v1::ConfigError);
    }
    {
      Env env({});
      CHECK_FALSE(core::cluster_launch_from_environment());
    }
  }

  TEST_CASE("malformed and inconsistent values name the variable") {
    CHECK(detect_error({{"RANK", "one"}, {"WORLD_SIZE", "2"}}).find("RANK='one'") != std::string::npos);
    CHECK(detect_error({{"RANK", "-1"}, {"WORLD_SIZE", "2"}}).find("RANK='-1'") != std::string::npos);
    CHECK(detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2x"}}).find("WORLD_SIZE='2x'") != std::string::npos);
    CHECK(detect_error({{"RANK", "0"}}).find("WORLD_SIZE is not") != std::string::npos);
    const std::string e = detect_error({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
    CHECK(e.find("RANK=4 is not below WORLD_SIZE=4") != std::string::npos);
    CHECK(detect_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0") != std::string::npos);
    CHECK(detect_error({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})
              .find("LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2") != std::string::npos);
    CHECK(detect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}})
              .find("LOCAL_WORLD_SIZE=3") != std::string::npos);
    CHECK(detect_error({{"PMI_RANK", "0"}}).find("PMI_SIZE") != std::string::npos);
    CHECK(detect_error({{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MPI_LOCALRANKID", "x"}})
              .find("MPI_LOCALRANKID='x'") != std::string::npos);
    CHECK(detect_error({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "2"}})
              .find("OMPI_COMM_WORLD_RANK=2 is not below OMPI_COMM_WORLD_SIZE=2") != std::string::npos);
    CHECK(detect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_TASKS_PER_NODE", "2(x"}})
              .find("SLURM_TASKS_PER_NODE='2(x'") != std::string::npos);
    CHECK(detect_error({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "3"},
                        {"SLURM_NTASKS_PER_NODE", "2"}})
              .find("SLURM_LOCALID=3 is not below SLURM_NTASKS_PER_NODE=2") != std::string::npos);
  }
}

TEST_SUITE("launch") {
  TEST_CASE("a LaunchSpec that cannot work is refused before anything starts") {
    core::LaunchSpec spec;
    spec.argv = {"/bin/true"};
    spec.nnodes = 2;
    spec.master_port = 0;
    CHECK_THROWS_WITH_AS(core::launch(spec), doctest::Contains("master_port = 0"), v1::ConfigError);
    spec.master_port = 29500;
    spec.node_rank = 2;
    CHECK_THROWS_WITH_AS(core::launch(spec), doctest::Contains("node_rank 2"), v1::ConfigError);
    spec.node_rank = 0;
    spec.mpiexec = true;
    CHECK_THROWS_WITH_AS(core::launch(spec), doctest::Contains("hostfile"), v1::ConfigError);
    core::LaunchSpec empty;
    CHECK_THROWS_AS(core::launch(empty), v1::ConfigError);
  }

  TEST_CASE("self_executable is this test binary") {
    CHECK(fs::path(core::self_executable()).filename() == "unit_launcher");
  }

  TEST_CASE("[launch] validation names the key and its place") {
    std::string e = validation_error(std::string(kJob) + "[launch]\nnnodes = 2\nnode_rank = 1\n");
    CHECK(e.find("master_port = 0") != std::string::npos);
    CHECK(e.find("nnodes = 2") != std::string::npos);
    e = validation_error(std::string(kJob) + "[launch]\nnnodes = 2\nnode_rank = 2\nmaster_port = 29500\n");
    CHECK(e.find(":13:") != std::string::npos);
    CHECK(e.find("node_rank 2 must be less than nnodes 2") != std::string::npos);
    e = validation_error(kJob, {"launch.launcher=torchrun"});
    CHECK(e.find("'torchrun' is not one of: auto, trainrun, mpiexec") != std::string::npos);
    e = validation_error(kJob, {"launch.launcher=mpiexec", "launch.nnodes=2", "launch.master_port=29500"});
    CHECK(e.find("mpiexec") != std::string::npos);
    CHECK(e.find("hostfile") != std::string::npos);
    e = validation_error(kJob, {"launch.stop_grace_s=\"soon\""});
    CHECK(e.find("stop_grace_s") != std::string::npos);
  }

  TEST_CASE("durations, defaults and the launcher choice") {
    auto job = validate(kJob, {"launch.rendezvous_timeout_s=\"2min\""});
    CHECK(job.launch.get_seconds("rendezvous_timeout_s") == doctest::Approx(120));
    CHECK(job.launch.get_seconds("stop_grace_s") == doctest::Approx(5));
    CHECK(core::launcher_of(job) == "trainrun");
    job = validate(kJob, {"launch.launcher=mpiexec"});
    CHECK(core::launcher_of(job) == "mpiexec");
  }

  TEST_CASE("the trainer: the launcher's world size wins; several processes need a launcher") {
    const auto job = validate(kJob);
    {
      Env env({{"PMI_RANK", "1"}, {"PMI_SIZE", "4"}});
      const auto ctx = core::context_from_environment(job);
      CHECK(ctx.rank == 1);
      CHECK(ctx.world_size == 4);
    }
    const auto four = validate(kJob, {"launch.nproc_per_node=4"});
    Env env({});
    CHECK_THROWS_WITH_AS(core::context_from_environment(four),
                         doctest::Contains("not started by a launcher"), v1::ConfigError);
  }
}

namespace {

// unit_launcher --launch NPROC GRACE_S RUN_DIR|- [mpiexec] -- COMMAND...
int probe(int argc, char** argv) {
  if (argc < 7) {
    std::cerr << "usage: unit_launcher --launch NPROC GRACE_S RUN_DIR|- [mpiexec] -- COMMAND...\n";
    return 2;
  }
  core::LaunchSpec spec;
  spec.nproc_per_node = std::atoi(argv[2]);
  spec.grace_s = std::atof(argv[3]);
  if (const char* t = std::getenv("TRAINRUN_TEST_SAVE_TIMEOUT_S")) spec.save_timeout_s = std::atof(t);
  if (std::getenv("TRAINRUN_TEST_STORE_LISTEN_ALL")) spec.store_listen_all = true;
  spec.run_dir = std::strcmp(argv[4], "-") == 0 ? "" : argv[4];
  spec.rotate_run_dir = true;
  int i = 5;
  if (std::strcmp(argv[i], "mpiexec") == 0) spec.mpiexec = true, ++i;
  if (std::strcmp(argv[i], "--") != 0) return probe(0, argv);
  for (++i; i < argc; ++i) spec.argv.push_back(argv[i]);
  try {
    return core::launch(spec);
  } catch (const std::exception& e) {
    std::cerr << "unit_launcher: error: " << e.what() << std::endl;
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--launch") == 0) return probe(argc, argv);
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
