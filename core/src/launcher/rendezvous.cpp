// The node agent's rendezvous (agent.hpp): node 0 opens the TCPStore (on master_addr only,
// store_bind.hpp), every agent registers in the round's keys, node 0 waits for all of them and
// publishes the result, and elastic rounds after the first give the workers a store of their own.
#include "agent.hpp"

#include <c10/util/Exception.h>
#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <chrono>
#include <cstring>

#include "store_bind.hpp"

namespace trainrun::core::launcher {

using v1::ConfigError;
using v1::Error;

void Agent::open_store() {
  if (spec_.node_rank == 0 && session_.server) {
    // A later round of an elastic job: the agents' store stays where they know it.
    store_ = session_.server.get();
    port_ = store_->getPort();
    return;
  }
  if (spec_.node_rank == 0) {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(spec_.master_port);
    o.isServer = true;
    o.waitWorkers = false;
    // The server's own client connects to itself at once; the long timeout is for the peers'
    // waits, set below.
    o.timeout = std::chrono::milliseconds(10000);
    try {
      QuietC10Logging quiet;
      std::optional<StoreBindScope> only_master_addr;
      if (!spec_.store_listen_all) only_master_addr.emplace(spec_.master_addr);
      own_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
      store_ = own_store_.get();
    } catch (const ConfigError&) {
      throw;
    } catch (const std::exception& e) {
      const std::string msg = v1::what_of(e);
      const std::string at = spec_.master_addr + ":" + std::to_string(spec_.master_port);
      if (msg.find("in use") != std::string::npos || msg.find("errno: 98") != std::string::npos)
        throw Error("cannot serve the rendezvous store on " + at + ": port " +
                    std::to_string(spec_.master_port) +
                    " is in use by another process ([launch] master_port); choose another "
                    "port, or master_port = 0 for a free one (single node only)");
      throw Error("cannot serve the rendezvous store on " + at +
                  " ([launch] master_addr, "
                  "master_port): " +
                  msg);
    }
    port_ = store_->getPort();
    store_->setTimeout(
        std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000)));
    if (elastic()) session_.server = std::move(own_store_);
    return;
  }
  port_ = spec_.master_port;
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(spec_.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  try {
    QuietC10Logging quiet;
    own_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
    store_ = own_store_.get();
  } catch (const std::exception& e) {
    throw Error("node " + std::to_string(spec_.node_rank) +
                ": could not reach node 0's "
                "rendezvous store at " +
                where() + " within " + fixed1(spec_.rendezvous_timeout_s) +
                " s ([launch] rendezvous_timeout_s); is trainrun running on node 0 with the same "
                "master_addr and master_port? (" +
                v1::what_of(e) + ")");
  }
}

bool Agent::rendezvous() {
  // Node 0 moves an earlier run aside before anyone can write there: the other agents open
  // their logs only after the rendezvous, which node 0 starts serving only after this.
  if (spec_.node_rank == 0 && spec_.rotate_run_dir && !spec_.run_dir.empty())
    keep_previous_run(spec_.run_dir);
  open_store();
  if (!multi_node()) return true;
  if (elastic() && spec_.node_rank == 0) {
    store_->set(kRoundKey, bytes(std::to_string(round_)));
    if (round_ > 0) serve_worker_store();
  }
  if (!join_round()) return false;
  if (spec_.node_rank == 0) return wait_for_agents();
  say("node " + std::to_string(spec_.node_rank) + " joined the rendezvous at " + where() +
      (round_ > 0 ? " (round " + std::to_string(round_) + ")" : "") +
      "; waiting for node 0 to confirm the layout");
  return wait_for_result();
}

// Registers this agent for the current round. A node_rank already claimed is a mistake (two
// agents given the same --node-rank), except in an elastic job whose round is under way: then
// this agent replaces one that is gone (its host was restarted, as Kubernetes restarts a pod),
// and it ends that round (a failure every agent sees, as torchrun's agents restart when a node
// waits to join) and joins the next one.
bool Agent::join_round() {
  AgentRecord me{host_name(), static_cast<long>(getpid()), spec_.nproc_per_node, spec_.nnodes};
  const std::string mine = me.encode();
  const auto deadline = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  // The round node 0 serves now, once it is at least the one this agent is to join (after a
  // failed round, node 0 opens the next one only when its own workers have stopped).
  auto wait_for_round = [&](int at_least) {
    auto current = [&] {
      return store_->check({kRoundKey}) ? std::atoi(text(store_->get(kRoundKey)).c_str()) : 0;
    };
    for (round_ = current(); round_ < at_least; round_ = current()) {
      if (stop_signals()) return false;
      if (Clock::now() >= deadline)
        throw Error("node " + std::to_string(spec_.node_rank) + ": node 0 at " + where() +
                    " did not open round " + std::to_string(at_least) + " within " +
                    fixed1(spec_.rendezvous_timeout_s) + " s ([launch] rendezvous_timeout_s)");
      pollfd p{signals_.fd(), POLLIN, 0};
      ::poll(&p, 1, kTickMs);
      signals_.drain();
    }
    return true;
  };
  if (elastic() && spec_.node_rank != 0 && !wait_for_round(session_.round)) {
    say("interrupted while waiting for round " + std::to_string(session_.round) +
        "; no worker was started");
    return false;
  }
  for (;;) {
    const std::string got = text(store_->compareSet(agent_key(spec_.node_rank), {}, bytes(mine)));
    if (got == mine) return true;
    const std::string earlier = AgentRecord::decode(got).who(spec_.node_rank);
    if (!elastic() || spec_.node_rank == 0 || !store_->check({key("rendezvous/result")})) {
      const std::string msg = "two agents claim node_rank " + std::to_string(spec_.node_rank) +
                              ": " + earlier + " and " + me.who(spec_.node_rank) +
                              "; give every node its own [launch] node_rank (--node-rank)";
      store_->compareSet(key("rendezvous/duplicate"), {}, bytes(msg));
      throw Error(msg);
    }
    const std::string why = me.who(spec_.node_rank) + " rejoined the job in place of " + earlier +
                            ", which is gone; restarting every node from the latest checkpoint";
    say(why + " (round " + std::to_string(round_) + " ends)");
    store_->compareSet(key("failed"), {}, bytes("1\n" + why));
    store_->set(rejoined_key(spec_.node_rank), bytes(mine));
    if (!wait_for_round(round_ + 1)) {
      say("interrupted while waiting for the next round; no worker was started");
      return false;
    }
  }
}

// The workers' store of a round after the first, on a free port of master_addr (every
// interface with store_listen = "all").
void Agent::serve_worker_store() {
  c10d::TCPStoreOptions o;
  o.port = 0;
  o.isServer = true;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  try {
    QuietC10Logging quiet;
    std::optional<StoreBindScope> only_master_addr;
    if (!spec_.store_listen_all) only_master_addr.emplace(spec_.master_addr);
    worker_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
  } catch (const std::exception& e) {
    throw Error("round " + std::to_string(round_) + ": cannot serve the workers' store on " +
                spec_.master_addr + " (a free port): " + v1::what_of(e));
  }
  worker_port_ = worker_store_->getPort();
}

void Agent::fail_rendezvous(const std::string& msg) {
  // The other agents read the reason from the store; give them a few ticks before it goes.
  store_->set(key("rendezvous/result"), bytes("error\n" + msg));
  ::poll(nullptr, 0, 3 * kTickMs);
  throw Error(msg);
}

bool Agent::wait_for_agents() {
  const auto deadline =
      t0_ + std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000));
  std::vector<std::string> keys;
  for (int n = 0; n < spec_.nnodes; ++n) keys.push_back(agent_key(n));
  say("rendezvous at " + where() + ": waiting for " + std::to_string(spec_.nnodes - 1) +
      " more node(s), up to " + fixed1(spec_.rendezvous_timeout_s) + " s");
  while (!store_->check(keys)) {
    if (stop_signals()) {
      say("interrupted during the rendezvous; no worker was started");
      store_->set(key("rendezvous/result"),
                  bytes("error\nnode 0 was interrupted during the rendezvous"));
      return false;
    }
    if (store_->check({key("rendezvous/duplicate")}))
      fail_rendezvous(text(store_->get(key("rendezvous/duplicate"))));
    if (Clock::now() >= deadline) {
      std::string missing, arrived;
      for (int n = 0; n < spec_.nnodes; ++n) {
        if (store_->check({agent_key(n)}))
          arrived += (arrived.empty() ? "" : ", ") +
                     AgentRecord::decode(text(store_->get(agent_key(n)))).who(n);
        else
          missing += (missing.empty() ? "" : ", ") + std::to_string(n);
      }
      fail_rendezvous("rendezvous at " + where() + ": node(s) " + missing + " of " +
                      std::to_string(spec_.nnodes) + " did not arrive within " +
                      fixed1(spec_.rendezvous_timeout_s) +
                      " s ([launch] rendezvous_timeout_s); "
                      "arrived: " +
                      arrived);
    }
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, kTickMs);
    signals_.drain();
  }
  const AgentRecord first = AgentRecord::decode(text(store_->get(agent_key(0))));
  for (int n = 1; n < spec_.nnodes; ++n) {
    const AgentRecord r = AgentRecord::decode(text(store_->get(agent_key(n))));
    if (r.nproc != first.nproc || r.nnodes != first.nnodes)
      fail_rendezvous(r.who(n) + " runs nproc_per_node " + std::to_string(r.nproc) + " x nnodes " +
                      std::to_string(r.nnodes) + ", but " + first.who(0) + " runs nproc_per_node " +
                      std::to_string(first.nproc) + " x nnodes " + std::to_string(first.nnodes) +
                      "; every node must use the same [launch] layout");
  }
  // "ok", or in a later round "ok\n<port of the workers' store>".
  store_->set(key("rendezvous/result"),
              bytes(worker_port_ ? "ok\n" + std::to_string(worker_port_) : "ok"));
  return true;
}

bool Agent::wait_for_result() {
  // Node 0 may have started up to a whole timeout after this node connected, and then waits a
  // timeout of its own.
  const auto deadline =
      Clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(spec_.rendezvous_timeout_s * 1000) + 5000);
  for (;;) {
    bool ready = false;
    try {
      ready = store_->check({key("rendezvous/result")});
    } catch (const std::exception& e) {
      throw Error("node " + std::to_string(spec_.node_rank) + ": node 0's agent at " + where() +
                  " went away during the rendezvous (see its output): " + v1::what_of(e));
    }
    if (ready) break;
    if (stop_signals()) {
      say("interrupted during the rendezvous; no worker was started");
      return false;
    }
    if (Clock::now() >= deadline)
      throw Error("node " + std::to_string(spec_.node_rank) + ": node 0 at " + where() +
                  " did not complete the rendezvous within " + fixed1(spec_.rendezvous_timeout_s) +
                  " s ([launch] rendezvous_timeout_s)");
    pollfd p{signals_.fd(), POLLIN, 0};
    ::poll(&p, 1, kTickMs);
    signals_.drain();
  }
  const std::string result = text(store_->get(key("rendezvous/result")));
  if (result.rfind("ok", 0) != 0) throw Error(result.substr(result.find('\n') + 1));
  if (result.size() > 3) worker_port_ = std::atoi(result.c_str() + 3);
  // From here on this connection carries the heartbeat and the job's failure: a store that
  // stops answering (node 0's host down or cut off) must be noticed within seconds, not after
  // the rendezvous timeout, which a TCPStore client keeps as its socket timeout for good.
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(spec_.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = std::chrono::milliseconds(
      static_cast<int64_t>(std::min(kStoreOpTimeoutS, spec_.rendezvous_timeout_s) * 1000));
  try {
    QuietC10Logging quiet;
    own_store_ = std::make_unique<c10d::TCPStore>(spec_.master_addr, o);
    store_ = own_store_.get();
    // LibTorch 1.13's client socket has no receive timeout until its first wait, which leaves
    // it at the store's timeout; a get waits. Without it a cut link blocks the agent for good.
    store_->get(key("rendezvous/result"));
  } catch (const std::exception& e) {
    throw Error("node " + std::to_string(spec_.node_rank) + ": node 0's agent at " + where() +
                " went away at the end of the rendezvous (see its output): " + v1::what_of(e));
  }
  return true;
}

}  // namespace trainrun::core::launcher
