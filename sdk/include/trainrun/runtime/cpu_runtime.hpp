#pragma once
// Per-rank CPU runtime: how many cores a rank may use, the sizes of its thread pools (LibTorch's
// intra-op and inter-op pools and the BLAS library's own pool), pinning each local rank to its
// own cores, and reading all of it back from the libraries and the kernel. Used by the CPU
// accelerators (cpu, gloo-cpu, mpi) and by the core's start-up banner; header-only so a
// third-party accelerator needs nothing else.
//
// Why these rules (measured on a 2-core AVX-512 Xeon, Debian 12, LibTorch 1.13, OpenBLAS 0.3.21,
// one process, samples/s of the MLP / CNN of plugins/models/models and tokens/s of the gpt):
// - LibTorch's pool is OpenMP here and its threads spin after each parallel region, while
//   OpenBLAS keeps a second pool of its own: both pools at 2 threads on 2 cores ran the MLP at
//   14.9k vs 33.8k samples/s and the gpt at 5.2k vs 11.2k tokens/s with LibTorch at 2 and BLAS
//   at 1. BLAS at 2 with LibTorch at 1 ties on the matmul-bound gpt but loses the convolutions
//   (CNN 1.9k vs 2.8k). Hence: LibTorch pools = the rank's core budget, BLAS pool = 1 thread.
// - Two ranks on one node that each size their pools for the whole node oversubscribe it the
//   same way; the budget is the node's usable cores divided by the local ranks.
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <dirent.h>
#include <dlfcn.h>
#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "trainrun/error.hpp"
#include "trainrun/options.hpp"

namespace trainrun::v1::cpu {

/// Parses a Linux CPU list ("0-3,8,10-11", as in /sys and cpuset files) into sorted unique
/// CPU ids. Throws Error naming the text when it is malformed.
inline std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    item.erase(std::remove_if(item.begin(), item.end(), ::isspace), item.end());
    if (item.empty()) continue;
    const auto dash = item.find('-');
    try {
      size_t used = 0;
      const int lo = std::stoi(item.substr(0, dash), &used);
      if (used != (dash == std::string::npos ? item.size() : dash) || lo < 0)
        throw std::invalid_argument(item);
      int hi = lo;
      if (dash != std::string::npos) {
        hi = std::stoi(item.substr(dash + 1), &used);
        if (used != item.size() - dash - 1 || hi < lo) throw std::invalid_argument(item);
      }
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    } catch (const std::logic_error&) {
      throw Error(detail::cat("malformed CPU list '", text, "' (expected e.g. \"0-3,8\")"));
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

/// Writes CPU ids as a compact list: {0,1,2,3,8} -> "0-3,8"; {} -> "".
inline std::string cpu_list_text(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

/// CPU bandwidth limit from a cgroup v2 `cpu.max` file ("max 100000" or "150000 100000"), in
/// cores (1.5 here); 0 when unlimited or unreadable.
inline double cgroup_v2_quota_cores(const std::string& cpu_max) {
  std::istringstream is(cpu_max);
  std::string quota;
  double period = 0;
  if (!(is >> quota >> period) || quota == "max" || period <= 0) return 0;
  try {
    return std::stod(quota) / period;
  } catch (const std::logic_error&) {
    return 0;
  }
}

/// CPU bandwidth limit from cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, in cores; 0 when
/// the quota is -1 (unlimited) or either value is not positive.
inline double cgroup_v1_quota_cores(long long quota_us, long long period_us) {
  if (quota_us <= 0 || period_us <= 0) return 0;
  return static_cast<double>(quota_us) / static_cast<double>(period_us);
}

namespace detail_cpu {
inline std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return f ? ss.str() : std::string();
}

// The cgroup quota of this process: cgroup v2's cpu.max, else v1's cfs quota, looked up under
// the process's own cgroup path first and the mount root second (containers usually see their
// own cgroup mounted at the root).
inline double cgroup_quota_cores() {
  std::ifstream f("/proc/self/cgroup");
  std::string v2_path, v1_path;
  for (std::string line; std::getline(f, line);) {
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (controllers.empty()) v2_path = path;
    std::stringstream cs(controllers);
    for (std::string c; std::getline(cs, c, ',');)
      if (c == "cpu") v1_path = path;
  }
  for (const std::string& dir : {"/sys/fs/cgroup" + v2_path, std::string("/sys/fs/cgroup")}) {
    const std::string text = read_file(dir + "/cpu.max");
    if (!text.empty()) return cgroup_v2_quota_cores(text);
  }
  for (const std::string& root : {std::string("/sys/fs/cgroup/cpu"), std::string("/sys/fs/cgroup/cpu,cpuacct")}) {
    for (const std::string& dir : {root + v1_path, root}) {
      const std::string q = read_file(dir + "/cpu.cfs_quota_us");
      const std::string p = read_file(dir + "/cpu.cfs_period_us");
      if (q.empty() || p.empty()) continue;
      try {
        return cgroup_v1_quota_cores(std::stoll(q), std::stoll(p));
      } catch (const std::logic_error&) {
        return 0;
      }
    }
  }
  return 0;
}
}  // namespace detail_cpu

/// The CPUs a thread may run on (sched_getaffinity of `tid`; 0 = the calling thread), sorted.
/// Throws Error with errno's text when the kernel refuses (e.g. the thread has exited).
inline std::vector<int> affinity_of(pid_t tid = 0) {
  const int n = std::max<int>(1024, static_cast<int>(sysconf(_SC_NPROCESSORS_CONF)));
  cpu_set_t* set = CPU_ALLOC(n);
  const size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, set);
  if (sched_getaffinity(tid, bytes, set) != 0) {
    const int e = errno;
    CPU_FREE(set);
    throw Error(detail::cat("sched_getaffinity(", tid, "): ", std::strerror(e)));
  }
  std::vector<int> out;
  for (int c = 0; c < n; ++c)
    if (CPU_ISSET_S(c, bytes, set)) out.push_back(c);
  CPU_FREE(set);
  return out;
}

/// Thread ids of this process (/proc/self/task), the calling thread included.
inline std::vector<pid_t> thread_ids() {
  std::vector<pid_t> out;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
    closedir(d);
  }
  return out;
}

/// The cores this process may use: its affinity mask, limited by its cgroup's CPU quota.
struct CoreBudget {
  std::vector<int> cpus;   ///< logical CPUs of the calling thread's affinity mask, sorted
  double quota_cores = 0;  ///< cgroup CPU bandwidth limit in cores; 0 = none
  int usable = 1;          ///< min(cpus.size(), floor(quota_cores) where limited), at least 1
  /// The mask is already this rank's own share (an outer launcher such as `srun --cpu-bind` or
  /// `mpiexec -bind-to` bound the rank): it is neither divided nor sliced again.
  bool per_rank = false;
  /// "2 cores (affinity 0-1)" or "2 cores (affinity 0-7, cgroup quota 2.0 cores)"
  std::string text() const {
    std::ostringstream os;
    os << usable << (usable == 1 ? " core" : " cores") << " (affinity " << cpu_list_text(cpus);
    if (per_rank) os << " bound by the launcher";
    if (quota_cores > 0) os << ", cgroup quota " << quota_cores << " cores";
    os << ")";
    return os.str();
  }
};

/// Measures the calling process's CoreBudget (call it before pinning: afterwards the mask is
/// this rank's own share). Throws Error when the affinity mask cannot be read.
inline CoreBudget available_cores() {
  CoreBudget b;
  b.cpus = affinity_of(0);
  b.quota_cores = detail_cpu::cgroup_quota_cores();
  int usable = static_cast<int>(b.cpus.size());
  if (b.quota_cores > 0) usable = std::min(usable, static_cast<int>(std::floor(b.quota_cores)));
  b.usable = std::max(1, usable);
  return b;
}

/// How one rank uses its cores. A count of 0 leaves that pool at the library's default.
struct ThreadPlan {
  int intra_op = 0;      ///< LibTorch intra-op threads (at::set_num_threads)
  int inter_op = 0;      ///< LibTorch inter-op threads (at::set_num_interop_threads)
  int blas = 0;          ///< BLAS threads (openblas_set_num_threads)
  std::vector<int> pin;  ///< CPUs every thread of the process is pinned to; empty = not pinned
  std::string reason;    ///< how the numbers were chosen, one line
};

/// Thread counts the environment asks for (0 = not set or not a positive integer). "auto" yields
/// to them, as LibTorch and OpenBLAS would: a user (or a test harness running several jobs at
/// once) who exports OMP_NUM_THREADS=1 means it.
struct EnvThreads {
  int omp = 0;       ///< OMP_NUM_THREADS
  int openblas = 0;  ///< OPENBLAS_NUM_THREADS
  /// Reads both variables of this process.
  static EnvThreads read() {
    auto get = [](const char* name) {
      const char* v = std::getenv(name);
      if (!v || !*v) return 0;
      char* end = nullptr;
      const long n = std::strtol(v, &end, 10);
      return (*end == '\0' && n > 0 && n <= 4096) ? static_cast<int>(n) : 0;
    };
    return {get("OMP_NUM_THREADS"), get("OPENBLAS_NUM_THREADS")};
  }
};

/// Plans one rank's pools from the options `threads` and `blas_threads` (kAuto, 0 = library
/// default, or a count) and `pin`, for local rank `local_rank` of `local_world_size` on a node
/// whose cores are `budget`:
/// - threads auto: OMP_NUM_THREADS where `env` has it, else usable cores / local ranks (at least
///   1), for the intra- and inter-op pools;
/// - blas_threads auto: OPENBLAS_NUM_THREADS where `env` has it, else 1 (see the measurements at
///   the top of this file);
/// - pin: local rank r gets the r-th of local_world_size equal, disjoint slices of the affinity
///   mask; skipped (and said so in `reason`) when there are more local ranks than CPUs.
/// Throws ConfigError for a negative count other than kAuto, or a bad rank layout.
inline ThreadPlan plan_threads(int64_t threads, int64_t blas_threads, bool pin, int local_rank,
                               int local_world_size, const CoreBudget& budget,
                               const EnvThreads& env = EnvThreads::read()) {
  TR_CHECK_TYPED(ConfigError, threads >= 0 || threads == kAuto,
                 "threads must be \"auto\" or >= 0, got ", threads);
  TR_CHECK_TYPED(ConfigError, blas_threads >= 0 || blas_threads == kAuto,
                 "blas_threads must be \"auto\" or >= 0, got ", blas_threads);
  TR_CHECK_TYPED(ConfigError, local_world_size >= 1 && local_rank >= 0 && local_rank < local_world_size,
                 "local rank ", local_rank, " is not in [0, local_world_size ", local_world_size, ")");
  ThreadPlan plan;
  const int ranks_sharing = budget.per_rank ? 1 : local_world_size;
  const int share = std::max(1, budget.usable / ranks_sharing);
  std::ostringstream why;
  if (threads == kAuto && env.omp > 0) {
    plan.intra_op = plan.inter_op = env.omp;
    why << "auto: OMP_NUM_THREADS=" << env.omp << " from the environment";
  } else if (threads == kAuto) {
    plan.intra_op = plan.inter_op = share;
    why << "auto: " << budget.text() << " / " << ranks_sharing
        << (ranks_sharing == 1 ? " local rank" : " local ranks");
    if (budget.usable < ranks_sharing) why << " (more ranks than cores)";
  } else if (threads == 0) {
    why << "LibTorch's default";
  } else {
    plan.intra_op = plan.inter_op = static_cast<int>(threads);
    why << "threads = " << threads;
  }
  plan.blas = blas_threads != kAuto ? static_cast<int>(blas_threads) : env.openblas > 0 ? env.openblas : 1;
  const auto n = static_cast<int>(budget.cpus.size());
  if (pin && budget.per_rank) {
    // Already bound: the launcher's binding is the pinning.
  } else if (pin && n >= local_world_size) {
    const int k = n / local_world_size;
    plan.pin.assign(budget.cpus.begin() + local_rank * k, budget.cpus.begin() + (local_rank + 1) * k);
  } else if (pin) {
    why << "; not pinned: " << local_world_size << " local ranks > " << n
        << (n == 1 ? " CPU" : " CPUs");
  }
  const size_t on = plan.pin.empty() ? (budget.per_rank ? budget.cpus.size() : 0) : plan.pin.size();
  if (on > 0 && static_cast<size_t>(plan.intra_op) > on)
    why << "; oversubscribed: " << plan.intra_op << " LibTorch threads on " << on
        << (on == 1 ? " CPU" : " CPUs");
  plan.reason = why.str();
  return plan;
}

/// What OpenBLAS reports about itself, read through its exported functions in the running
/// process (dlsym on the global scope, where LibTorch's BLAS dependency was loaded).
struct BlasInfo {
  bool openblas = false;  ///< OpenBLAS's functions were found; false for any other BLAS
  std::string config;     ///< openblas_get_config(): "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY ..."
  std::string corename;   ///< openblas_get_corename(): the kernel set in use ("SkylakeX", "Prescott")
  int threads = 0;        ///< openblas_get_num_threads()
};

/// Reads BlasInfo; never throws (a BLAS other than OpenBLAS gives openblas = false).
inline BlasInfo blas_info() {
  BlasInfo info;
  using text_fn = char* (*)();
  using int_fn = int (*)();
  auto config = reinterpret_cast<text_fn>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  auto core = reinterpret_cast<text_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  auto threads = reinterpret_cast<int_fn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  if (!config || !core || !threads) return info;
  info.openblas = true;
  info.config = config();
  while (!info.config.empty() && std::isspace(static_cast<unsigned char>(info.config.back())))
    info.config.pop_back();
  info.corename = core();
  info.threads = threads();
  return info;
}

/// Sets OpenBLAS's thread count; returns false (and does nothing) when the BLAS in this process
/// is not OpenBLAS.
inline bool set_blas_threads(int n) {
  using set_fn = void (*)(int);
  auto set = reinterpret_cast<set_fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (!set) return false;
  set(n);
  return true;
}

/// Pins every thread of this process (each entry of /proc/self/task, so pools that already
/// exist, such as OpenBLAS's, move too) to `cpus`; threads created later inherit the mask of
/// their creator. Throws Error naming the CPUs when the kernel refuses them.
inline void pin_all_threads(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  const int n = std::max<int>(1024, cpus.back() + 1);
  cpu_set_t* set = CPU_ALLOC(n);
  const size_t bytes = CPU_ALLOC_SIZE(n);
  CPU_ZERO_S(bytes, set);
  for (int c : cpus) CPU_SET_S(c, bytes, set);
  int err = 0;
  if (sched_setaffinity(0, bytes, set) != 0) err = errno;
  for (pid_t tid : thread_ids())
    if (!err && sched_setaffinity(tid, bytes, set) != 0 && errno != ESRCH) err = errno;
  CPU_FREE(set);
  if (err)
    throw Error(detail::cat("cannot pin to CPUs ", cpu_list_text(cpus), ": ", std::strerror(err)));
}

/// Cores kept busy right now by everything on the node, this process included: the share of
/// non-idle time in /proc/stat over `seconds`, times the online CPUs. Unlike the load average
/// (a decaying 1-minute mean) it does not report a job that has just ended. 0 when /proc/stat
/// is unreadable.
inline double busy_cores_now(double seconds = 0.1) {
  auto sample = [](double& busy, double& total) {
    std::ifstream f("/proc/stat");
    std::string cpu;
    double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // user nice system idle iowait irq softirq steal
    if (!(f >> cpu) || cpu != "cpu") return false;
    for (double& x : v) f >> x;
    total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
    busy = total - v[3] - v[4];
    return static_cast<bool>(f);
  };
  double b0 = 0, t0 = 0, b1 = 0, t1 = 0;
  if (!sample(b0, t0)) return 0;
  usleep(static_cast<useconds_t>(seconds * 1e6));
  if (!sample(b1, t1) || t1 <= t0) return 0;
  return (b1 - b0) / (t1 - t0) * static_cast<double>(sysconf(_SC_NPROCESSORS_ONLN));
}

/// Applies a plan: pinning first (so pools started afterwards inherit it), then LibTorch's
/// intra-op threads, its inter-op threads (once per process: LibTorch fixes that pool's size
/// once and throws on a second call, and several accelerators can be built in one process, so a
/// refusal is a warning on stderr naming `who`), then the BLAS pool. Warns on stderr when the
/// plan is oversubscribed (more LibTorch threads than its CPUs). Throws Error when pinning fails.
inline void apply(const ThreadPlan& plan, const char* who) {
  pin_all_threads(plan.pin);
  if (plan.intra_op > 0) at::set_num_threads(plan.intra_op);
  if (plan.inter_op > 0) {
    static std::once_flag once;
    const int n = plan.inter_op;
    std::call_once(once, [n, who] {
      if (at::get_num_interop_threads() == n) return;
      try {
        at::set_num_interop_threads(n);
      } catch (const c10::Error&) {
        std::fprintf(stderr,
                     "trainrun %s: warning: inter-op threads already fixed at %d by earlier "
                     "LibTorch work; keeping that\n",
                     who, at::get_num_interop_threads());
      }
    });
  }
  if (plan.blas > 0) set_blas_threads(plan.blas);
  if (plan.reason.find("oversubscribed: ") != std::string::npos)
    std::fprintf(stderr, "trainrun %s: warning: %s\n", who, plan.reason.c_str());
}

/// The runtime as the libraries and the kernel report it now, for banners and tests.
struct Readback {
  int intra_op = 0;           ///< at::get_num_threads()
  int inter_op = 0;           ///< at::get_num_interop_threads()
  BlasInfo blas;              ///< blas_info()
  std::vector<int> affinity;  ///< the calling thread's CPUs
  int threads_total = 0;      ///< threads of the process (/proc/self/task)
  int threads_elsewhere = 0;  ///< of those, threads whose mask differs from the calling thread's
};

/// Reads the runtime back; never throws (a thread that exits while being read is skipped).
inline Readback read_back() {
  Readback r;
  r.intra_op = at::get_num_threads();
  r.inter_op = at::get_num_interop_threads();
  r.blas = blas_info();
  try {
    r.affinity = affinity_of(0);
  } catch (const Error&) {
  }
  for (pid_t tid : thread_ids()) {
    try {
      const auto mask = affinity_of(tid);
      ++r.threads_total;
      if (mask != r.affinity) ++r.threads_elsewhere;
    } catch (const Error&) {
    }
  }
  return r;
}

/// "2 threads (auto: 2 cores (affinity 0-1) / 1 local rank), BLAS 1 thread, pinned to CPUs 0-1"
/// as read back after apply(), for an accelerator's describe().
inline std::string describe(const ThreadPlan& plan) {
  const Readback r = read_back();
  std::ostringstream os;
  os << r.intra_op << (r.intra_op == 1 ? " thread" : " threads") << " (" << plan.reason << ")";
  if (r.blas.openblas)
    os << ", BLAS " << r.blas.threads << (r.blas.threads == 1 ? " thread" : " threads")
       << (plan.blas == 0 ? " (OpenBLAS's default)" : "");
  if (!plan.pin.empty()) os << ", pinned to CPU" << (plan.pin.size() == 1 ? " " : "s ") << cpu_list_text(plan.pin);
  else os << ", not pinned";
  return os.str();
}

}  // namespace trainrun::v1::cpu
