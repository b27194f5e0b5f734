#pragma once
// The process-level CPU runtime the core decides before any rank starts: which OpenBLAS kernel
// set the ranks run ([launch] blas_coretype), and the start-up banner that shows LibTorch's
// build, the BLAS library and kernel, every rank's thread pools and pinning, and the backends.
//
// OpenBLAS picks its kernels once, when it is loaded, from the CPU model it recognises, and
// falls back to generic SSE3 kernels ("Prescott") for a model it does not know; only
// OPENBLAS_CORETYPE, set before the library loads, overrides that. trainrun links LibTorch and
// so OpenBLAS: the choice is made in the launcher (which sets the variable in its workers'
// environment) or, for a process that runs alone or under mpiexec/SLURM, by running itself
// again once with the variable set. A chosen kernel is first tried in a child process
// (`trainrun blas-probe`), which must report that kernel and compute a small sgemm that matches
// a double-precision reference; a kernel that is refused, unknown or crashes (SIGILL) is never
// used.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "trainrun/core/config.hpp"
#include "trainrun/runtime/cpu_runtime.hpp"

namespace trainrun::core {

/// CPU features that decide which OpenBLAS kernel set a CPU can run (cpuid).
struct CpuFeatures {
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false, avx512cd = false;
  bool avx512bf16 = false;
};

/// This CPU's features.
CpuFeatures cpu_features();

/// The spelling OpenBLAS uses for a kernel set name given in any case ("haswell" -> "Haswell"),
/// or "" for a name trainrun does not know.
std::string canonical_kernel(const std::string& name);

/// Every kernel name canonical_kernel knows, comma-separated (for error messages).
std::string known_kernels();

/// Vector ISA tier of an OpenBLAS kernel set name (case-insensitive): 4 AVX-512 (SkylakeX,
/// Cooperlake, SapphireRapids), 3 AVX2 (Haswell, Zen), 2 AVX (Sandybridge, Bulldozer, ...),
/// 1 SSE-era kernels (Prescott, Core2, Nehalem, Atom, ...), 0 unknown name.
int blas_kernel_tier(const std::string& corename);

/// Name of a tier: "AVX-512", "AVX2", "AVX", "SSE", "unknown".
const char* tier_name(int tier);

/// The best OpenBLAS kernel set for `cpu`: "Cooperlake" (AVX-512 with BF16), "SkylakeX"
/// (AVX-512 F/BW/VL/DQ/CD), "Haswell" (AVX2 + FMA), "Sandybridge" (AVX), else "".
std::string best_blas_kernel(const CpuFeatures& cpu);

/// What to do about the BLAS kernel.
struct BlasChoice {
  bool select = false;  ///< run the ranks with OPENBLAS_CORETYPE = coretype
  std::string coretype;
  std::string note;     ///< one line for the banner: the kernel and why
  bool warn = false;    ///< note is a warning the user should act on
};

/// Decides from the option ([launch] blas_coretype: "auto", "off" or a kernel name), the
/// OPENBLAS_CORETYPE already in the environment (nullopt when unset), what OpenBLAS loaded and
/// the best kernel for this CPU. "auto" selects `best` only when the loaded kernel belongs to a
/// lower ISA tier (a kernel name it does not know is kept), and leaves a user's
/// OPENBLAS_CORETYPE alone (warning when it costs a tier).
BlasChoice decide_blas_kernel(const std::string& option, const std::optional<std::string>& env,
                              const v1::cpu::BlasInfo& loaded, const std::string& best);

/// Result of trying a kernel in a child process.
struct BlasProbe {
  bool ok = false;
  std::string corename;  ///< the kernel the child's OpenBLAS reported
  double max_rel_err = 0;
  std::string message;   ///< why it failed, naming the kernel
};

/// Runs `trainrun blas-probe` with OPENBLAS_CORETYPE = coretype (timeout 60 s) and checks it.
BlasProbe probe_blas_kernel(const std::string& coretype);

/// The whole decision: decide_blas_kernel, then `probe` on the kernel it selects. An explicit
/// kernel that the probe refuses falls back to what "auto" decides (probed in turn), so a
/// refused choice never runs a slower kernel than "auto" would; the note (a warning) names the
/// kernel the run uses and why. A refused "auto" choice keeps the kernel OpenBLAS loaded.
/// `probe` is probe_blas_kernel in the product; tests pass their own.
BlasChoice resolve_blas_kernel(const std::string& option, const std::optional<std::string>& env,
                               const v1::cpu::BlasInfo& loaded, const std::string& best,
                               const std::function<BlasProbe(const std::string&)>& probe);

/// OPENBLAS_CORETYPE as the user set it (nullopt when unset or empty). For tests only,
/// TRAINRUN_TEST_OPENBLAS_OWN_CORETYPE=NAME says that an OPENBLAS_CORETYPE equal to NAME stands
/// for the kernel OpenBLAS would pick by itself on this machine, not for the user's choice: it
/// lets one machine exercise both the CPUs OpenBLAS recognises and those where it falls back.
std::optional<std::string> user_coretype_env();

/// Body of `trainrun blas-probe`: prints "corename NAME" and "max_rel_err E" for a 96x80 by
/// 80x64 sgemm against a double reference; returns 0, or 1 when OpenBLAS is absent.
int blas_probe_main();

/// Applies [launch] blas_coretype for this process before it trains or launches: decides,
/// probes, and records the outcome in TRAINRUN_BLAS_CHOICE (and OPENBLAS_CORETYPE) for the
/// workers and the banner. A process that will train itself (`launching` false) and needs a
/// kernel change runs its own command line again (execv, does not return). Does nothing when
/// TRAINRUN_BLAS_CHOICE is already set (by the launcher or the first run). Warnings go to stderr.
void select_blas_kernel(const JobConfig& job, char** argv, bool launching);

/// "LibTorch 1.13.1 (OpenMP, oneDNN v2.6.3, CPU capability AVX2)".
std::string libtorch_build_text();

/// Lines of `trainrun check`'s runtime section: LibTorch, BLAS and the kernel decision (probed),
/// and the planned pools and pinning of each local rank from the accelerator's `threads`,
/// `blas_threads` and `pin` options when it declares them.
std::vector<std::string> check_runtime_lines(const JobConfig& job,
                                             const std::vector<std::string>& accelerators);

}  // namespace trainrun::core
