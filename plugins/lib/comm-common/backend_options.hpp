#pragma once
// The options every collective backend (gloo-cpu, mpi, cuda) takes alike, declared and read in
// one place so their names, defaults, ranges, help and checks cannot drift apart.
#include <trainrun/error.hpp>
#include <trainrun/options.hpp>

namespace trainrun::comm {

/// [accelerator] timeout_s, stall_warning_s and check_collectives, as read and checked.
struct BackendOptions {
  double timeout_s = 600;         ///< default timeout of each operation and of the set-up, s
  double stall_warning_s = 60;    ///< name the ranks not arrived after this long; 0 = off
  bool check_collectives = true;  ///< compare each collective's signature across ranks first
};

/// Declares the three options in an accelerator's schema.
inline void declare_backend_options(v1::OptionSchema& schema) {
  schema.duration("timeout_s", 600.0,
                  "default timeout of every collective and point-to-point operation, and of the "
                  "set-up (rendezvous)",
                  0.001);
  schema.duration("stall_warning_s", 60.0,
                  "warn (naming the ranks not arrived) when an operation has waited this long; "
                  "0 = off",
                  0.0);
  schema.boolean("check_collectives", true,
                 "check that every rank issues the same collective (op, dtype, size, root) at "
                 "the same position before it runs; a mismatch is an error naming both ranks "
                 "instead of a hang or wrong data");
}

/// Reads them; throws ConfigError naming the accelerator's section for timeout_s <= 0 or
/// stall_warning_s < 0.
inline BackendOptions backend_options(const v1::Options& options) {
  BackendOptions b;
  b.timeout_s = options.get_seconds("timeout_s");
  TR_CHECK_TYPED(v1::ConfigError, b.timeout_s > 0, options.context(),
                 ": timeout_s must be > 0, got ", b.timeout_s);
  b.stall_warning_s = options.get_seconds("stall_warning_s");
  TR_CHECK_TYPED(v1::ConfigError, b.stall_warning_s >= 0, options.context(),
                 ": stall_warning_s must be >= 0, got ", b.stall_warning_s);
  b.check_collectives = options.get_bool("check_collectives");
  return b;
}

}  // namespace trainrun::comm
