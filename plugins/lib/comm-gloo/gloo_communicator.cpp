// GlooCommunicator: joining a group (rendezvous, the TCP mesh, the shared-memory channels and
// the two-level all-reduce's plan), leaving it, and new_group. The operations are in
// gloo_issue.cpp, gloo_collectives.cpp and gloo_point_to_point.cpp.
#include "gloo_communicator.hpp"

#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <sstream>

#include "gloo_communicator_impl.hpp"

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

// ---------------------------------------------------------------------------------------------
// Gloo's rendezvous store on top of c10d's

// Gloo's connectFullMesh needs a gloo::rendezvous::Store; the job's store is a c10d one
// (TCPStore, or HashStore for a world of one), shared by every group. Keys get the group's
// prefix here rather than through c10d::PrefixStore, which wants an intrusive_ptr to a store
// that comm-common hands out as a shared_ptr.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::shared_ptr<c10d::Store> store, std::string prefix, Millis timeout)
      : store_(std::move(store)), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    const auto v = store_->get(prefix_ + key);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Millis& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    store_->wait(full, timeout);
  }

 private:
  std::shared_ptr<c10d::Store> store_;
  std::string prefix_;
  Millis timeout_;
};

}  // namespace

void GlooCommunicator::Impl::connect_shm(const std::string& where) {
  shm::Transport::Config sc;
  sc.backend = kBackend;
  sc.group = name;
  sc.prefix = prefix;
  sc.rank = rank;
  sc.global_ranks = global_ranks;
  sc.peer_name = [this](int r) { return peer_name(r); };
  shm = std::make_shared<shm::Transport>(store, std::move(sc));
  // Each rank knows only its own channels; a group runs its collectives over shared memory
  // only when every member reaches every other, so all of them pick the same algorithm.
  const std::string key = prefix + "shm_collectives/";
  const bool mine = shm->peers() == size - 1;
  store->set(key + std::to_string(rank), std::vector<uint8_t>{mine ? uint8_t{1} : uint8_t{0}});
  bool all = true;
  for (int r = 0; r < size; ++r)
    all = all && store->get(key + std::to_string(r)) == std::vector<uint8_t>{1};
  shm_collectives = all;
  if (!all && settings.allreduce_algorithm == GlooSettings::Algorithm::Auto) plan_hierarchy(where);
}

// Decides, identically on every rank, whether all_reduce runs in two levels, and connects the
// column mesh if so. Each rank publishes the group ranks it reaches over shm in both
// directions; the levels apply only when those sets partition the group into >= 2 machines of
// equal size >= 2 (the segment a rank reduces on its machine must match the segments its
// column peers reduce on theirs). Otherwise all_reduce stays on Gloo's TCP ring.
void GlooCommunicator::Impl::plan_hierarchy(const std::string& where) {
  const std::string key = prefix + "shm_machine/";
  std::vector<int> local{rank};
  for (int r = 0; r < size; ++r)
    if (r != rank && shm->can_send(r) && shm->can_recv(r)) local.push_back(r);
  std::sort(local.begin(), local.end());
  const std::string mine = comm::join_ranks(local);
  store->set(key + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> of(size);
  for (int r = 0; r < size; ++r) {
    const auto v = store->get(key + std::to_string(r));
    of[r].assign(v.begin(), v.end());
  }
  // Machines by their lowest rank: a set is a machine where its lowest member is the rank
  // that published it; every member must have published the same set.
  std::vector<std::vector<int>> machines;
  std::vector<int> machine_of(size, -1);
  for (int r = 0; r < size; ++r) {
    if (machine_of[r] >= 0) continue;
    std::vector<int> members;
    std::istringstream in(of[r]);
    for (std::string t; std::getline(in, t, ',');) members.push_back(std::stoi(t));
    if (members.empty() || members.front() != r) return;  // asymmetric: one level
    for (int q : members) {
      if (q < 0 || q >= size || machine_of[q] >= 0 || of[q] != of[r]) return;
      machine_of[q] = static_cast<int>(machines.size());
    }
    machines.push_back(std::move(members));
  }
  const size_t per = machines.front().size();
  if (machines.size() < 2 || per < 2) return;
  for (const auto& m : machines)
    if (m.size() != per) return;
  const auto& here = machines[machine_of[rank]];
  node_ring = here;
  node_position = static_cast<int>(std::find(here.begin(), here.end(), rank) - here.begin());
  try {
    auto mesh = std::make_shared<gloo::rendezvous::Context>(machine_of[rank],
                                                            static_cast<int>(machines.size()));
    mesh->setTimeout(to_millis(settings.timeout_s));
    GlooStore column_store(store, prefix + "column" + std::to_string(node_position) + "/",
                           to_millis(settings.rendezvous_timeout_s));
    mesh->connectFullMesh(column_store, device);
    column = std::move(mesh);
  } catch (const std::exception& e) {
    TR_FAIL(where, ": rank ", global_ranks[rank], " could not connect Gloo's TCP mesh of the ",
            machines.size(), " ranks at position ", node_position,
            " of their machines (hierarchical all_reduce): ", what_of(e));
  }
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<c10d::Store> store,
                                   std::shared_ptr<gloo::transport::Device> device,
                                   GlooSettings settings, std::string id, std::string name,
                                   std::vector<int> global_ranks, int rank)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.store = std::move(store);
  m.device = std::move(device);
  m.settings = settings;
  m.id = std::move(id);
  m.name = std::move(name);
  m.prefix = "g" + (m.id.empty() ? std::string("0") : m.id) + "/";
  m.global_ranks = std::move(global_ranks);
  m.rank = rank;
  m.size = static_cast<int>(m.global_ranks.size());
  const std::string where = detail::cat(kBackend, ": group ", m.name);

  // A sub-group's members must have passed the same list; compared after the rendezvous, when
  // every member's list is in the store.
  const std::string members_key = m.prefix + "members/";
  const std::string mine = comm::join_ranks(m.global_ranks);
  if (!m.id.empty())
    m.store->set(members_key + std::to_string(m.global_ranks[rank]),
                 std::vector<uint8_t>(mine.begin(), mine.end()));
  // Before the rendezvous, so that every member's entry is there once it has passed.
  if (m.size > 1) shm::Transport::publish(*m.store, m.prefix, m.rank, m.settings.shm);
  auto peers = comm::rendezvous(*m.store, m.prefix + "rendezvous/", m.rank, m.size,
                                m.settings.rendezvous_timeout_s, where);
  if (!m.id.empty()) {
    for (int g : m.global_ranks) {
      const auto v = m.store->get(members_key + std::to_string(g));
      const std::string theirs(v.begin(), v.end());
      TR_CHECK(theirs == mine, where, ": global rank ", m.global_ranks[rank],
               " called new_group with global ranks [", mine, "] but rank ", g,
               " called it with [", theirs,
               "] (every rank of the parent group must pass the same list)");
    }
  }

  try {
    m.context = std::make_shared<gloo::rendezvous::Context>(m.rank, m.size);
    // Fixed for the life of the mesh: Gloo's pairs take it when connecting, and its bcube
    // all-reduce waits with it.
    m.context->setTimeout(to_millis(m.settings.timeout_s));
    GlooStore gloo_store(m.store, m.prefix + "gloo/", to_millis(m.settings.rendezvous_timeout_s));
    m.context->connectFullMesh(gloo_store, m.device);
  } catch (const std::exception& e) {
    TR_FAIL(where, ": rank ", m.global_ranks[rank], " could not connect Gloo's TCP mesh of ",
            m.size, " ranks (", m.device->str(), "): ", what_of(e));
  }

  if (m.size > 1 && m.settings.shm) m.connect_shm(where);
  m.monitor =
      comm::open_monitor(m.store, {kBackend, m.name, m.prefix, m.rank, m.size, m.global_ranks},
                         m.settings, std::move(peers));
}

GlooCommunicator::~GlooCommunicator() {
  auto& m = *impl_;
  // Before the connections close: the peers' failing operations read this rank's progress.
  if (m.monitor && m.size > 1) m.monitor->publish_now();
  // Nobody will wait for what is still queued or running: fail it now rather than block here
  // until it times out, and let the peers' matching operations fail too.
  if (m.in_flight > 0) {
    {
      std::lock_guard<std::mutex> g(m.state_mu);
      if (!m.poison)
        m.poison = std::make_exception_ptr(Error(detail::cat(
            kBackend, ": group ", m.name, ": the communicator was destroyed while operations "
            "were still queued or running")));
    }
    m.fail(nullptr);
  }
  m.worker.stop();
  if (m.shm) m.shm->stop();  // after the worker, which may still post to it
  m.reaper.stop();
}

int GlooCommunicator::rank() const { return impl_->rank; }
int GlooCommunicator::world_size() const { return impl_->size; }
const std::string& GlooCommunicator::group_name() const { return impl_->name; }
int GlooCommunicator::shm_peers() const { return impl_->shm ? impl_->shm->peers() : 0; }
bool GlooCommunicator::shm_collectives() const { return impl_->shm_collectives; }
int GlooCommunicator::hierarchy_machines() const {
  auto& m = *impl_;
  return m.column ? m.size / static_cast<int>(m.node_ring.size()) : 0;
}
int GlooCommunicator::shm_single_copy_peers() const {
  return impl_->shm ? impl_->shm->single_copy_peers() : 0;
}

std::shared_ptr<Communicator> GlooCommunicator::new_group(const std::vector<int>& ranks) {
  auto& m = *impl_;
  TR_CHECK(!ranks.empty(), kBackend, ": new_group in group ", m.name, ": the rank list is empty");
  std::vector<int> seen(m.size, 0);
  for (int r : ranks) {
    TR_CHECK(r >= 0 && r < m.size, kBackend, ": new_group in group ", m.name, ": rank ", r,
             " is not a rank of this group (world_size ", m.size, ")");
    TR_CHECK(!seen[r]++, kBackend, ": new_group in group ", m.name, ": rank ", r,
             " is listed twice in [", comm::join_ranks(ranks), "]");
  }
  m.throw_if_poisoned();
  int number;
  {
    // Counted on every rank of this group, member or not, so that the n-th new_group call
    // gets the same id (and store prefix) everywhere.
    std::lock_guard<std::mutex> g(m.issue_mu);
    number = ++m.groups_created;
  }
  const auto it = std::find(ranks.begin(), ranks.end(), m.rank);
  if (it == ranks.end()) return nullptr;
  const std::string id = (m.id.empty() ? "" : m.id + ".") + std::to_string(number);
  std::vector<int> global;
  for (int r : ranks) global.push_back(m.global_ranks[r]);
  const std::string name = id + " [" + comm::join_ranks(global) + "]";
  return std::make_shared<GlooCommunicator>(m.store, m.device, m.settings, id, name,
                                            std::move(global),
                                            static_cast<int>(it - ranks.begin()));
}

}  // namespace trainrun::plugins
