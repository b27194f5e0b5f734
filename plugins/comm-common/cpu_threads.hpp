#pragma once
// The `threads` option of the CPU accelerators (cpu, gloo-cpu, mpi): LibTorch's intra-op and
// inter-op thread pools. Header-only so the single-process cpu plugin needs none of
// comm-common's store machinery.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <trainrun/error.hpp>
#include <trainrun/options.hpp>

#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace trainrun::comm {

/// Declares `threads` (integer, default 0 = LibTorch's default) in an accelerator's schema.
inline void declare_threads_option(v1::OptionSchema& schema) {
  schema.integer("threads", 0,
                 "LibTorch intra-op and inter-op threads (0 = LibTorch's default, usually one "
                 "per core; with several ranks per host, give each cores / ranks)",
                 0.0, 4096.0);
}

/// Applies option `threads` when > 0: intra-op threads always, inter-op threads once per
/// process. LibTorch fixes the inter-op pool size once, before the pool starts, and throws on a
/// second call; several accelerators can be built in one process (tests, sub-groups), so only
/// the first asks, and a refusal is a warning: the intra-op count, which is what matters for
/// training throughput, is still applied. Throws ConfigError for a negative count.
inline void apply_threads_option(const v1::Options& options, const char* backend) {
  const int64_t threads = options.get_int("threads");
  TR_CHECK_TYPED(v1::ConfigError, threads >= 0, options.context(),
                 ": threads must be >= 0, got ", threads);
  if (threads == 0) return;
  const int n = static_cast<int>(threads);
  at::set_num_threads(n);
  static std::once_flag once;
  std::call_once(once, [n, backend] {
    if (at::get_num_interop_threads() == n) return;
    try {
      at::set_num_interop_threads(n);
    } catch (const c10::Error&) {
      std::fprintf(stderr,
                   "trainrun %s: warning: inter-op threads already fixed at %d by earlier "
                   "LibTorch work; keeping that (intra-op threads set to %d)\n",
                   backend, at::get_num_interop_threads(), n);
    }
  });
}

/// "1 thread" / "4 threads": LibTorch's intra-op threads, for an accelerator's describe().
inline std::string threads_text() {
  const int n = at::get_num_threads();
  return std::to_string(n) + (n == 1 ? " thread" : " threads");
}

}  // namespace trainrun::comm
