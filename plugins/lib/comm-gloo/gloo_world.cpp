// open_gloo_world: the world's store (the job's, or an in-process one for a world of one) and
// the TCP device Gloo listens on, then the world's GlooCommunicator.
#include "gloo_communicator.hpp"

#include <trainrun/error.hpp>
#include <trainrun/error_text.hpp>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <gloo/transport/tcp/device.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstdlib>

#include "comm_common.hpp"
#include "gloo_communicator_impl.hpp"  // kBackend

namespace trainrun::plugins {

using namespace trainrun::v1;

namespace {

// Peers on one machine reach each other over loopback; Gloo would otherwise bind to the
// address of the host name, which on Debian resolves to 127.0.1.1 or to an external interface.
bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  bool all = true;
  for (addrinfo* a = res; a; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all = all && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all = all && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    } else {
      all = false;
    }
  }
  freeaddrinfo(res);
  return all;
}

}  // namespace

GlooWorld open_gloo_world(const GlooSettings& s, const RunContext& ctx) {
  TR_CHECK_TYPED(ConfigError, ctx.world_size >= 1 && ctx.rank >= 0 && ctx.rank < ctx.world_size,
                 kBackend, ": rank ", ctx.rank, " is not in [0, world_size ", ctx.world_size, ")");

  const auto address = comm::store_address_from_environment();
  std::shared_ptr<c10d::Store> store;
  gloo::transport::tcp::attr attr;
  if (!address) {
    TR_CHECK_TYPED(ConfigError, ctx.world_size == 1, kBackend, ": world_size ", ctx.world_size,
                   " needs MASTER_ADDR and MASTER_PORT (the rendezvous store); start the ranks "
                   "with the trainrun launcher or torchrun");
    store = std::make_shared<c10d::HashStore>();
    attr.hostname = "127.0.0.1";
  } else {
    store = comm::open_store(*address, ctx.rank, ctx.world_size, s.rendezvous_timeout_s);
    const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
    if (is_loopback(address->host))
      attr.hostname = "127.0.0.1";
    else if (ifname && *ifname)
      attr.iface = ifname;
    else
      attr.hostname = comm::host_name();
  }
  GlooWorld w;
  w.transport = "tcp " + (attr.iface.empty() ? attr.hostname : attr.iface);
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    TR_FAIL(kBackend, ": cannot open a TCP device on ",
            attr.iface.empty() ? "host " + attr.hostname
                               : "interface '" + attr.iface + "' (GLOO_SOCKET_IFNAME)",
            ": ", what_of(e));
  }
  std::vector<int> world(ctx.world_size);
  for (int r = 0; r < ctx.world_size; ++r) world[r] = r;
  w.communicator = std::make_unique<GlooCommunicator>(std::move(store), std::move(device), s, "",
                                                      "world", std::move(world), ctx.rank);
  return w;
}

}  // namespace trainrun::plugins
