// The rendezvous store's listening address.
// c10d's TCPStore server (LibTorch 1.13) listens on the wildcard address of its port, i.e. on
// every interface, and has no option to do otherwise. The store has no authentication: anyone
// who reaches the port can read and write the job's keys (fail it, or impersonate a rank). So
// while node 0's agent opens the store, the executable's bind() (exported through
// core/memory.dynlist, so it interposes LibTorch's call into libc) replaces a wildcard address
// with master_addr's, and refuses the other address family, which c10d then skips. At any other
// time, and for any other address, it is libc's bind().
#include "store_bind.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netdb.h>
#include <netinet/in.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include <trainrun/error.hpp>

namespace {
std::atomic<const sockaddr_storage*> g_store_bind{nullptr};
}  // namespace

extern "C" __attribute__((visibility("default"))) int bind(int fd, const struct sockaddr* addr,
                                                           socklen_t len) {
  using Real = int (*)(int, const struct sockaddr*, socklen_t);
  static const Real real = reinterpret_cast<Real>(dlsym(RTLD_NEXT, "bind"));
  const sockaddr_storage* want = g_store_bind.load();
  if (want != nullptr && addr != nullptr) {
    if (addr->sa_family == AF_INET && len >= sizeof(sockaddr_in) &&
        reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == htonl(INADDR_ANY)) {
      if (want->ss_family != AF_INET) return errno = EADDRNOTAVAIL, -1;
      sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(addr);
      a.sin_addr = reinterpret_cast<const sockaddr_in*>(want)->sin_addr;
      return real(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    }
    if (addr->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6) &&
        IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr)) {
      if (want->ss_family != AF_INET6) return errno = EADDRNOTAVAIL, -1;
      sockaddr_in6 a = *reinterpret_cast<const sockaddr_in6*>(addr);
      a.sin6_addr = reinterpret_cast<const sockaddr_in6*>(want)->sin6_addr;
      return real(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    }
  }
  return real(fd, addr, len);
}

namespace trainrun::core::launcher {

StoreBindScope::StoreBindScope(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw v1::ConfigError("[launch] master_addr = \"" + host + "\": cannot resolve it (" +
                          gai_strerror(rc) + "); the rendezvous store listens on this address");
  std::memcpy(&addr_, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  g_store_bind.store(&addr_);
}

StoreBindScope::~StoreBindScope() { g_store_bind.store(nullptr); }

}  // namespace trainrun::core::launcher
