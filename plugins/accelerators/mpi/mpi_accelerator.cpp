// MpiAccelerator: the rendezvous before MPI_Init where the job has a store, the process's MPI
// (mpi_runtime.cpp), the world's group on a duplicate of MPI_COMM_WORLD, and the store its
// Monitors share (the job's, or one rank 0 serves and announces over MPI).
#include "mpi.hpp"

#include <trainrun/error.hpp>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <cstring>
#include <exception>

#include "cpu_threads.hpp"
#include "mpi_detail.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;
using namespace mpi_detail;

namespace {

// The store the Monitors share. Under trainrun's launcher (or with MASTER_ADDR/MASTER_PORT set by
// the user) it is the job's store; under a bare mpiexec nobody serves one, so rank 0 starts one
// on a free port and tells the others over MPI where it is.
std::shared_ptr<c10d::Store> open_job_store(Group& g) {
  if (g.size == 1) return std::make_shared<c10d::HashStore>();
  if (auto address = comm::store_address_from_environment()) {
    auto store = comm::open_store(*address, g.rank, g.size, g.options.timeout_s);
    if (g.rank == 0 && !address->agent_serves) g.rt->served_store = store;
    return store;
  }

  // Loopback when every rank runs on this host: always reachable, whatever the host name
  // resolves to; otherwise the host name, which the other hosts must be able to resolve.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  check_mpi(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name", "store set-up", *g.rt);
  std::vector<char> names(static_cast<size_t>(g.size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(),
                           MPI_MAX_PROCESSOR_NAME, MPI_CHAR, g.comm, &request),
            "MPI_Iallgather", "store set-up (processor names)", *g.rt);
  wait_request(request, g.options.timeout_s, "store set-up (processor names)", *g.rt);
  bool one_host = true;
  for (int r = 1; r < g.size; ++r)
    one_host = one_host && std::strncmp(&names[static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME],
                                        names.data(), MPI_MAX_PROCESSOR_NAME) == 0;

  // Rank 0 sends "host:port", or "!" and why it could not serve, so no rank waits in vain.
  std::shared_ptr<c10d::Store> store;
  std::vector<char> message(1024, '\0');
  if (g.rank == 0) {
    std::string text;
    try {
      int port = 0;
      store = comm::serve_store(0, g.size, g.options.timeout_s, &port);
      text = detail::cat(one_host ? std::string("127.0.0.1") : comm::host_name(), ":", port);
    } catch (const std::exception& e) {
      text = std::string("!") + e.what();
    }
    std::strncpy(message.data(), text.c_str(), message.size() - 1);
  }
  check_mpi(
      MPI_Ibcast(message.data(), static_cast<int>(message.size()), MPI_CHAR, 0, g.comm, &request),
      "MPI_Ibcast", "store set-up (address)", *g.rt);
  wait_request(request, g.options.timeout_s, "store set-up (address)", *g.rt);
  const std::string text(message.data());
  TR_CHECK(text.empty() || text[0] != '!',
           "mpi: rank 0 could not start the job's store: ", text.substr(1));
  if (g.rank == 0) {
    g.rt->served_store = store;
    return store;
  }
  const auto colon = text.rfind(':');
  TR_CHECK(colon != std::string::npos, "mpi: malformed store address '", text, "' from rank 0");
  comm::StoreAddress address;
  address.host = text.substr(0, colon);
  address.port = std::stoi(text.substr(colon + 1));
  address.agent_serves = true;  // rank 0 serves it: everyone else only connects
  return comm::open_store(address, g.rank, g.size, g.options.timeout_s);
}

}  // namespace

void MpiAccelerator::declare_options(OptionSchema& schema) {
  comm::declare_threads_option(schema);
  comm::declare_backend_options(schema);
}

MpiAccelerator::MpiAccelerator(const Options& options, const RunContext& ctx) {
  const comm::BackendOptions backend = comm::backend_options(options);
  const double timeout_s = backend.timeout_s;
  threads_ = comm::apply_threads_option(options, ctx, "mpi");

  // Where the job has a store (trainrun's launcher, or MASTER_ADDR/MASTER_PORT), the ranks meet
  // there before MPI_Init: a rank that dies or never starts before MPI_Init leaves its peers
  // blocked inside MPI_Init (hydra stops them only once every rank has initialised), whereas
  // this rendezvous names it within the rendezvous timeout.
  std::shared_ptr<c10d::Store> store;
  bool serves_store = false;
  if (ctx.world_size > 1) {
    if (auto address = comm::store_address_from_environment()) {
      const double rdzv_s = comm::rendezvous_timeout_from_environment();
      store = comm::open_store(*address, ctx.rank, ctx.world_size, rdzv_s);
      serves_store = ctx.rank == 0 && !address->agent_serves;
      comm::rendezvous(*store, "mpi/init/", ctx.rank, ctx.world_size, rdzv_s,
                       "mpi: before MPI_Init");
      store->setTimeout(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    }
  }

  runtime_ = Runtime::acquire();
  if (serves_store) runtime_->served_store = store;
  int world_rank = 0, world_size = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank), "MPI_Comm_rank", "start-up", *runtime_);
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world_size), "MPI_Comm_size", "start-up", *runtime_);
  TR_CHECK(world_size == ctx.world_size, "mpi: MPI_COMM_WORLD has ", world_size,
           " rank(s) but the job has world_size ", ctx.world_size,
           world_size == 1
               ? ": this process was not started by mpiexec (run `mpiexec -n N trainrun ...`, "
                 "or let trainrun's launcher start the ranks through mpiexec)"
               : ": the ranks were started by different launchers");
  TR_CHECK(world_rank == ctx.rank, "mpi: this process is rank ", world_rank,
           " of MPI_COMM_WORLD but rank ", ctx.rank, " of the job (RANK/PMI_RANK disagree)");

  auto g = std::make_shared<Group>();
  g->rt = runtime_;
  g->name = "world";
  g->prefix = detail::cat("mpi/", ++runtime_->accelerators, "/");
  g->options = backend;
  for (int r = 0; r < world_size; ++r) g->global_ranks.push_back(r);
  // A duplicate keeps trainrun's messages and collectives apart from anything else in the
  // process that uses MPI_COMM_WORLD (MPI matches by communicator).
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &request), "MPI_Comm_idup", "start-up", *runtime_);
  wait_request(request, timeout_s, "start-up (MPI_Comm_idup of MPI_COMM_WORLD)", *runtime_);
  set_comm(*g, dup, "start-up");
  g->store = store ? store : open_job_store(*g);
  attach_monitor(*g);
  world_ = std::make_unique<MpiCommunicator>(std::move(g));
}

// Groups (and, through them, MPI) may outlive the accelerator; MPI is finalised by whichever
// holder of the Runtime goes last.
MpiAccelerator::~MpiAccelerator() {
  // Destroyed by an exception, this rank is failing: finalising would keep the job alive until
  // every peer's collective timeout (up to timeout_s), while leaving without it makes mpiexec end
  // all ranks now, with this rank's exit code (see Runtime).
  if (std::uncaught_exceptions() > 0)
    runtime_->fail(
        "the rank is failing (the accelerator was destroyed by an exception); "
        "mpiexec ends the other ranks");
}

std::string MpiAccelerator::describe() const {
  return detail::cat("mpi (", runtime_->library, "), rank ", world_->rank(), " of ",
                     world_->world_size(), ", ", v1::cpu::describe(threads_));
}

}  // namespace trainrun::plugins