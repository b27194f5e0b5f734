// Rendezvous (comm_common.hpp): where the job's store is, opening or serving it, and every rank
// of a group announcing itself and waiting for the others, naming those that never come.
#include "comm_common.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include "comm_internal.hpp"

namespace trainrun::comm {

using namespace trainrun::v1;
using namespace internal;

// The first host of a SLURM host list: "node[03-05,9],gpu1" -> "node03"; each bracket group
// stands for its first entry (zero padding kept), as `scontrol show hostnames` would list first.
std::string slurm_first_host(const std::string& list) {
  std::string out;
  int depth = 0;
  bool skipping = false;
  for (char c : list) {
    if (c == ',' && depth == 0) break;
    if (c == '[') {
      ++depth;
      skipping = false;
      continue;
    }
    if (c == ']') {
      --depth;
      skipping = false;
      continue;
    }
    if (depth > 0) {
      if (c == ',' || c == '-') skipping = true;
      if (!skipping) out += c;
      continue;
    }
    out += c;
  }
  return out;
}

// Under srun (SLURM_PROCID) without MASTER_ADDR/MASTER_PORT: rank 0 serves the store on the
// step's first node (where srun's block distribution puts task 0), on a port derived from the
// job and step ids so that concurrent jobs and steps on one node differ.
std::optional<StoreAddress> store_address_from_slurm() {
  const char* procid = std::getenv("SLURM_PROCID");
  if (!procid || !*procid) return std::nullopt;
  const char* nodes = std::getenv("SLURM_STEP_NODELIST");
  if (!nodes || !*nodes) nodes = std::getenv("SLURM_JOB_NODELIST");
  if (!nodes || !*nodes) nodes = std::getenv("SLURM_NODELIST");
  const char* job = std::getenv("SLURM_JOB_ID");
  if (!job || !*job) job = std::getenv("SLURM_JOBID");
  TR_CHECK_TYPED(ConfigError, nodes && *nodes && job && *job,
                 "SLURM_PROCID is set but SLURM_STEP_NODELIST / SLURM_JOB_ID are not, and neither "
                 "is MASTER_ADDR / MASTER_PORT: set MASTER_ADDR and MASTER_PORT (the rendezvous "
                 "store) in the job script");
  const char* step = std::getenv("SLURM_STEP_ID");
  const long long job_id = std::atoll(job);
  const long long step_id = step ? std::atoll(step) : 0;
  StoreAddress a;
  a.host = slurm_first_host(nodes);
  a.port = 20000 + static_cast<int>((job_id * 16 + (step_id & 15)) % 40000);
  a.from = "SLURM (first node of " + std::string(nodes) + ", port from job " + job + " step " +
           std::to_string(step_id) + "; set MASTER_ADDR and MASTER_PORT to choose)";
  return a;
}

std::optional<StoreAddress> store_address_from_environment() {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  if (!addr && !port) return store_address_from_slurm();
  TR_CHECK_TYPED(ConfigError, addr && *addr,
                 "MASTER_PORT is set but MASTER_ADDR is not: set both "
                 "(the address and port of the rendezvous store)");
  TR_CHECK_TYPED(ConfigError, port && *port,
                 "MASTER_ADDR is set but MASTER_PORT is not: set both "
                 "(the address and port of the rendezvous store)");
  char* end = nullptr;
  const long p = std::strtol(port, &end, 10);
  TR_CHECK_TYPED(ConfigError, end && *end == '\0' && p >= 1 && p <= 65535, "MASTER_PORT='", port,
                 "' is not a port number in [1, 65535]");
  StoreAddress a;
  a.host = addr;
  a.port = static_cast<int>(p);
  const char* agent = std::getenv("TRAINRUN_AGENT_STORE");
  a.agent_serves = agent && std::string(agent) == "1";
  return a;
}

std::shared_ptr<c10d::Store> open_store(const StoreAddress& address, int rank, int world_size,
                                        double timeout_s) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(address.port);
  opts.isServer = rank == 0 && !address.agent_serves;
  opts.waitWorkers = false;
  opts.numWorkers = c10::nullopt;
  opts.timeout = millis(timeout_s);
  const std::string where = address.host + ":" + std::to_string(address.port) +
                            (address.from.empty() ? "" : " (from " + address.from + ")");
  try {
    return std::make_shared<c10d::TCPStore>(address.host, opts);
  } catch (const std::exception& e) {
    const std::string msg = what_of(e);
    if (opts.isServer)
      TR_FAIL("rank 0 cannot serve the rendezvous store on ", where,
              msg.find("in use") != std::string::npos || msg.find("EADDRINUSE") != std::string::npos
                  ? " (the port is in use: choose another [launch] master_port / MASTER_PORT)"
                  : "",
              ": ", msg);
    TR_FAIL("rank ", rank, " of ", world_size, " cannot reach the rendezvous store at ", where,
            address.agent_serves ? " (served by the trainrun launcher)" : " (served by rank 0)",
            " within ", seconds_text(timeout_s), ": ", msg);
  }
}

std::shared_ptr<c10d::Store> serve_store(int port, int world_size, double timeout_s,
                                         int* bound_port) {
  (void)world_size;
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(port);
  opts.isServer = true;
  opts.waitWorkers = false;
  opts.timeout = millis(timeout_s);
  try {
    auto store = std::make_shared<c10d::TCPStore>("127.0.0.1", opts);
    if (bound_port) *bound_port = store->getPort();
    return store;
  } catch (const std::exception& e) {
    TR_FAIL("cannot serve a rendezvous store on port ", port, ": ", what_of(e));
  }
}

double rendezvous_timeout_from_environment() {
  const char* v = std::getenv("TRAINRUN_RENDEZVOUS_TIMEOUT_S");
  if (!v || !*v) return 300.0;
  char* end = nullptr;
  const double s = std::strtod(v, &end);
  TR_CHECK_TYPED(ConfigError, end && *end == '\0' && std::isfinite(s) && s > 0,
                 "TRAINRUN_RENDEZVOUS_TIMEOUT_S='", v, "' is not a positive number of seconds");
  return s;
}

std::string host_name() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

std::vector<PeerIdentity> rendezvous(c10d::Store& store, const std::string& prefix, int rank,
                                     int world_size, double timeout_s, const std::string& where) {
  const std::string me = host_name() + kSep + std::to_string(getpid());
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + "arrived/" + std::to_string(r));
  try {
    store.set(keys[rank], bytes_of(me));
  } catch (const std::exception& e) {
    TR_FAIL(where, ": rank ", rank,
            " cannot announce itself to the rendezvous store: ", what_of(e));
  }
  // Polled rather than store.wait(keys): on a timeout, wait() says only that it timed out, and
  // the user needs to know which ranks never came.
  const auto deadline = Clock::now() + millis(timeout_s);
  std::vector<bool> here(world_size, false);
  here[rank] = true;
  auto sleep = std::chrono::milliseconds(2);
  for (;;) {
    bool all = true;
    for (int r = 0; r < world_size; ++r) {
      if (here[r]) continue;
      try {
        here[r] = store.check({keys[r]});
      } catch (const std::exception& e) {
        TR_FAIL(where, ": rank ", rank, " lost the rendezvous store while waiting for rank ", r,
                ": ", what_of(e));
      }
      all = all && here[r];
    }
    if (all) break;
    if (Clock::now() >= deadline) {
      std::string missing, arrived;
      for (int r = 0; r < world_size; ++r) {
        if (!here[r]) {
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        } else {
          std::string who;
          try {
            auto f = split(string_of(store.get(keys[r])), kSep);
            who = f.size() >= 2 ? " on " + f[0] + " pid " + f[1] : "";
          } catch (const std::exception&) {
          }
          arrived += (arrived.empty() ? "" : ", ") + std::to_string(r) + who;
        }
      }
      TR_FAIL(where, ": rendezvous of ", world_size, " ranks: rank(s) ", missing,
              " did not arrive within ", seconds_text(timeout_s), " (arrived: ", arrived, ")");
    }
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, std::chrono::milliseconds(100));
  }
  std::vector<PeerIdentity> peers(world_size);
  for (int r = 0; r < world_size; ++r) {
    auto f = split(string_of(store.get(keys[r])), kSep);
    peers[r].rank = r;
    peers[r].host = f.empty() ? "?" : f[0];
    peers[r].pid = f.size() >= 2 ? std::atoll(f[1].c_str()) : 0;
  }
  return peers;
}

}  // namespace trainrun::comm
