#pragma once
// The rendezvous store's listening address (the node agent, agent.cpp).
#include <sys/socket.h>

#include <string>

namespace trainrun::core::launcher {

/// For the life of the object, the process's wildcard binds (c10d's TCPStore server listening on
/// every interface) go to `host`'s address instead, and binds of the other address family fail
/// with EADDRNOTAVAIL (store_bind.cpp says why). Throws ConfigError naming [launch] master_addr
/// when `host` does not resolve. One at a time per process.
class StoreBindScope {
 public:
  explicit StoreBindScope(const std::string& host);
  ~StoreBindScope();
  StoreBindScope(const StoreBindScope&) = delete;
  StoreBindScope& operator=(const StoreBindScope&) = delete;

 private:
  sockaddr_storage addr_{};
};

}  // namespace trainrun::core::launcher
