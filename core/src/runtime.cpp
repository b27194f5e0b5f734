#include "trainrun/core/runtime.hpp"

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "trainrun/core/launcher.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/spelling.hpp"

extern char** environ;

namespace trainrun::core {

namespace {

bool same_kernel(const std::string& a, const std::string& b) { return to_lower(a) == to_lower(b); }

// Sets or replaces NAME=value in an environment block for posix_spawn.
std::vector<std::string> env_with(const std::vector<std::pair<std::string, std::string>>& set) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    bool replaced = false;
    for (const auto& [k, v] : set) replaced = replaced || kv.rfind(k + "=", 0) == 0;
    if (!replaced) out.push_back(kv);
  }
  for (const auto& [k, v] : set) out.push_back(k + "=" + v);
  return out;
}

}  // namespace

CpuFeatures cpu_features() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512cd = __builtin_cpu_supports("avx512cd");
  // GCC 12 knows "avx512bf16"; /proc/cpuinfo's flag is the fallback for older compilers.
#if defined(__GNUC__) && __GNUC__ >= 12
  f.avx512bf16 = __builtin_cpu_supports("avx512bf16");
#endif
  return f;
}

namespace {
// OpenBLAS's kernel set names (as OPENBLAS_CORETYPE takes them) with their vector ISA tier.
struct KernelName {
  const char* name;
  int tier;
};
constexpr KernelName kKernels[] = {
    {"Prescott", 1},    {"Core2", 1},       {"Penryn", 1},      {"Dunnington", 1},
    {"Nehalem", 1},     {"Atom", 1},        {"Katmai", 1},      {"Coppermine", 1},
    {"Northwood", 1},   {"Banias", 1},      {"Opteron", 1},     {"Opteron_SSE3", 1},
    {"Barcelona", 1},   {"Bobcat", 1},      {"Nano", 1},        {"Athlon", 1},
    {"Sandybridge", 2}, {"Bulldozer", 2},   {"Piledriver", 2},  {"Steamroller", 2},
    {"Excavator", 2},   {"Haswell", 3},     {"Zen", 3},         {"SkylakeX", 4},
    {"Cooperlake", 4},  {"SapphireRapids", 4}};
}  // namespace

std::string canonical_kernel(const std::string& name) {
  for (const auto& k : kKernels)
    if (to_lower(name) == to_lower(k.name)) return k.name;
  return "";
}

std::string known_kernels() {
  std::string out;
  for (const auto& k : kKernels) out += (out.empty() ? "" : ", ") + std::string(k.name);
  return out;
}

int blas_kernel_tier(const std::string& corename) {
  for (const auto& k : kKernels)
    if (to_lower(corename) == to_lower(k.name)) return k.tier;
  return 0;
}

const char* tier_name(int tier) {
  switch (tier) {
    case 4: return "AVX-512";
    case 3: return "AVX2";
    case 2: return "AVX";
    case 1: return "SSE";
  }
  return "unknown";
}

std::string best_blas_kernel(const CpuFeatures& cpu) {
  const bool avx512 = cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.avx512cd;
  if (avx512 && cpu.avx512bf16) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (cpu.avx2 && cpu.fma) return "Haswell";
  if (cpu.avx) return "Sandybridge";
  return "";
}

BlasChoice decide_blas_kernel(const std::string& option, const std::optional<std::string>& env,
                              const v1::cpu::BlasInfo& loaded, const std::string& best) {
  BlasChoice c;
  if (!loaded.openblas) {
    c.note = "the BLAS in this process is not OpenBLAS: blas_coretype has no effect";
    c.warn = option != "auto" && option != "off";
    return c;
  }
  const int have = blas_kernel_tier(loaded.corename), can = blas_kernel_tier(best);
  if (option == "off") {
    c.note = "kernel " + loaded.corename + " (blas_coretype = \"off\": OpenBLAS's own choice)";
    return c;
  }
  if (option != "auto") {
    const std::string name = canonical_kernel(option).empty() ? option : canonical_kernel(option);
    const int want = blas_kernel_tier(name);
    if (same_kernel(name, loaded.corename)) {
      c.note = "kernel " + loaded.corename + " (blas_coretype = \"" + option + "\")";
    } else {
      c.select = true;
      c.coretype = name;
      c.note = "kernel " + name + " (blas_coretype = \"" + option + "\"; OpenBLAS picked " +
               loaded.corename + (env ? ", OPENBLAS_CORETYPE=" + *env + " from the environment overridden" : "") + ")";
    }
    if (want > 0 && want < can) {
      c.warn = true;
      c.note += ": an " + std::string(tier_name(want)) + " kernel on a CPU that runs " + best + " (" +
                tier_name(can) + "), so slower than \"auto\"";
    }
    return c;
  }
  if (env) {
    c.note = "kernel " + loaded.corename + " (OPENBLAS_CORETYPE=" + *env + " from the environment)";
    if (have < can) {
      c.warn = true;
      c.note += ": an " + std::string(tier_name(have)) + " kernel on a CPU that runs " + best + " (" +
                tier_name(can) + "); unset OPENBLAS_CORETYPE to let trainrun choose";
    }
    return c;
  }
  if (have == 0) {
    c.note = "kernel " + loaded.corename + " (auto: a kernel this trainrun does not know; kept)";
    return c;
  }
  if (have < can) {
    c.select = true;
    c.coretype = best;
    c.note = "kernel " + best + " (auto: OpenBLAS picked " + loaded.corename + ", an " +
             tier_name(have) + " kernel, on a CPU that runs " + tier_name(can) + ")";
    return c;
  }
  c.note = "kernel " + loaded.corename + " (auto: OpenBLAS's choice already uses this CPU's " +
           tier_name(std::max(have, can)) + ")";
  return c;
}

int blas_probe_main() {
  const v1::cpu::BlasInfo info = v1::cpu::blas_info();
  using sgemm_fn = void (*)(const char*, const char*, const int*, const int*, const int*,
                            const float*, const float*, const int*, const float*, const int*,
                            const float*, float*, const int*);
  auto sgemm = reinterpret_cast<sgemm_fn>(dlsym(RTLD_DEFAULT, "sgemm_"));
  if (!info.openblas || !sgemm) {
    std::printf("corename none\n");
    return 1;
  }
  // Column-major C(m x n) = A(m x k) * B(k x n), sizes that are not multiples of any kernel's
  // register block, so edge handling runs too.
  const int m = 96, k = 80, n = 64;
  std::vector<float> a(m * k), b(k * n), c(m * n, 0.f);
  for (int i = 0; i < m * k; ++i) a[i] = static_cast<float>(std::sin(0.37 * i + 0.1));
  for (int i = 0; i < k * n; ++i) b[i] = static_cast<float>(std::cos(0.23 * i + 0.3));
  const float one = 1.f, zero = 0.f;
  sgemm("N", "N", &m, &n, &k, &one, a.data(), &m, b.data(), &k, &zero, c.data(), &m);
  double worst = 0;
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double ref = 0, mag = 0;
      for (int p = 0; p < k; ++p) {
        ref += static_cast<double>(a[i + p * m]) * b[p + j * k];
        mag += std::fabs(static_cast<double>(a[i + p * m]) * b[p + j * k]);
      }
      worst = std::max(worst, std::fabs(c[i + j * m] - ref) / std::max(mag, 1e-30));
    }
  std::printf("corename %s\nmax_rel_err %.3g\n", info.corename.c_str(), worst);
  return 0;
}

BlasProbe probe_blas_kernel(const std::string& coretype) {
  BlasProbe r;
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/trainrun-blas-probe-XXXXXX";
  const int fd = mkstemp(tmpl);
  if (fd < 0) {
    r.message = std::string("cannot create a temporary file: ") + std::strerror(errno);
    return r;
  }
  const std::string exe = self_executable();
  std::vector<std::string> args = {exe, "blas-probe"};
  std::vector<std::string> env =
      env_with({{"OPENBLAS_CORETYPE", coretype}, {"OPENBLAS_NUM_THREADS", "1"},
                {"OPENBLAS_VERBOSE", "0"}});
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fd, STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int err = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fd);
  auto finish = [&] { fs::remove(tmpl); };
  if (err != 0) {
    r.message = "cannot run " + exe + " blas-probe: " + std::strerror(err);
    finish();
    return r;
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      r.message = "the probe with OPENBLAS_CORETYPE=" + coretype + " did not finish in 60 s";
      finish();
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::ifstream out(tmpl);
  for (std::string key; out >> key;) {
    if (key == "corename") out >> r.corename;
    else if (key == "max_rel_err") out >> r.max_rel_err;
  }
  finish();
  if (WIFSIGNALED(status)) {
    r.message = "the probe with OPENBLAS_CORETYPE=" + coretype + " was killed by signal " +
                std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
                "): this CPU cannot run that kernel";
  } else if (WEXITSTATUS(status) != 0) {
    r.message = "the probe with OPENBLAS_CORETYPE=" + coretype + " exited with status " +
                std::to_string(WEXITSTATUS(status));
  } else if (!same_kernel(r.corename, coretype)) {
    r.message = "OpenBLAS did not take OPENBLAS_CORETYPE=" + coretype + " (the probe ran kernel " +
                (r.corename.empty() ? "?" : r.corename) +
                " instead: this OpenBLAS build has no such kernel, or this CPU cannot run it)";
  } else if (!(r.max_rel_err <= 1e-5)) {
    std::ostringstream os;
    os << "kernel " << coretype << " computed a test sgemm with relative error " << r.max_rel_err
       << " (limit 1e-5)";
    r.message = os.str();
  } else {
    r.ok = true;
  }
  return r;
}

BlasChoice resolve_blas_kernel(const std::string& option, const std::optional<std::string>& env,
                               const v1::cpu::BlasInfo& loaded, const std::string& best,
                               const std::function<BlasProbe(const std::string&)>& probe) {
  BlasChoice choice = decide_blas_kernel(option, env, loaded, best);
  if (!choice.select) return choice;
  const BlasProbe tried = probe(choice.coretype);
  if (tried.ok) return choice;
  choice.warn = true;
  if (option == "auto") {
    choice.select = false;
    choice.note = "kernel " + loaded.corename + " kept: " + tried.message +
                  "; to choose a kernel yourself set OPENBLAS_CORETYPE=NAME before starting trainrun";
    return choice;
  }
  // On exactly the CPUs where the kernel matters, OpenBLAS's own pick is its SSE fallback:
  // keeping it after a refusal would run several times slower than "auto".
  BlasChoice fallback = decide_blas_kernel("auto", env, loaded, best);
  if (fallback.select) {
    const BlasProbe again = probe(fallback.coretype);
    if (!again.ok) {
      fallback.select = false;
      fallback.note = "kernel " + loaded.corename + " (OpenBLAS's own; \"auto\"'s " +
                      fallback.coretype + " was refused too: " + again.message + ")";
    }
  }
  choice.select = fallback.select;
  choice.coretype = fallback.coretype;
  choice.note = fallback.note + ", as \"auto\" decides, because blas_coretype \"" + option +
                "\" was refused: " + tried.message +
                "; set [launch] blas_coretype to another kernel, or \"auto\"";
  return choice;
}

std::optional<std::string> user_coretype_env() {
  const char* e = std::getenv("OPENBLAS_CORETYPE");
  if (!e || !*e) return std::nullopt;
  const char* own = std::getenv("TRAINRUN_TEST_OPENBLAS_OWN_CORETYPE");
  if (own && same_kernel(own, e)) return std::nullopt;
  return std::string(e);
}

void select_blas_kernel(const JobConfig& job, char** argv, bool launching) {
  if (std::getenv("TRAINRUN_BLAS_CHOICE")) return;
  const std::string option = job.launch.get_string("blas_coretype");
  const v1::cpu::BlasInfo loaded = v1::cpu::blas_info();
  const BlasChoice choice = resolve_blas_kernel(option, user_coretype_env(), loaded,
                                                best_blas_kernel(cpu_features()), probe_blas_kernel);
  if (choice.warn) log_warn("[launch] blas_coretype: " + choice.note);
  setenv("TRAINRUN_BLAS_CHOICE", choice.note.c_str(), 1);
  if (!choice.select) return;
  setenv("OPENBLAS_CORETYPE", choice.coretype.c_str(), 1);
  if (launching) return;  // the workers inherit the environment
  // OpenBLAS is already loaded in this process with the old kernel: start over once.
  const std::string exe = self_executable();
  execv(exe.c_str(), argv);
  log_warn("[launch] blas_coretype: cannot run " + exe + " again (" + std::strerror(errno) +
           "); continuing with kernel " + loaded.corename);
  setenv("TRAINRUN_BLAS_CHOICE", ("kernel " + loaded.corename + " (re-running with " +
                                  choice.coretype + " failed)").c_str(), 1);
}

std::string libtorch_build_text() {
  std::string backend = "native";
  const std::string info = at::get_parallel_info();
  if (auto p = info.find("ATen parallel backend: "); p != std::string::npos) {
    backend = info.substr(p + 23);
    backend = backend.substr(0, backend.find('\n'));
  }
  std::string capability;
  const std::string config = at::show_config();
  if (auto p = config.find("CPU capability usage: "); p != std::string::npos) {
    capability = config.substr(p + 22);
    capability = capability.substr(0, capability.find('\n'));
  }
  std::string onednn = at::get_mkldnn_version();
  if (auto p = onednn.find(" v"); p != std::string::npos) onednn = "oneDNN" + onednn.substr(p, onednn.find(' ', p + 1) - p);
  std::ostringstream os;
  os << "LibTorch " << TRAINRUN_BUILD_TORCH_VERSION << " (" << backend;
  if (!onednn.empty()) os << ", " << onednn;
  if (!capability.empty()) os << ", CPU capability " << capability;
  os << ")";
  return os.str();
}

std::vector<std::string> check_runtime_lines(const JobConfig& job,
                                             const std::vector<std::string>& accelerators) {
  std::vector<std::string> lines;
  const v1::cpu::BlasInfo loaded = v1::cpu::blas_info();
  lines.push_back(libtorch_build_text() + " | " +
                  (loaded.openblas ? loaded.config : std::string("BLAS: not OpenBLAS")));
  const BlasChoice choice =
      resolve_blas_kernel(job.launch.get_string("blas_coretype"), user_coretype_env(), loaded,
                          best_blas_kernel(cpu_features()), probe_blas_kernel);
  // A kernel that is still selected passed its probe.
  lines.push_back("BLAS " + choice.note + (choice.select ? " [probe ok]" : "") +
                  (choice.warn ? " (warning)" : ""));
  const auto& opts = job.accelerator.options;
  const int local = static_cast<int>(job.launch.get_int("nproc_per_node"));
  if (opts.has("threads") && opts.has("blas_threads") && opts.has("pin")) {
    const v1::cpu::CoreBudget budget = v1::cpu::available_cores();
    for (int r = 0; r < local; ++r) {
      const auto plan = v1::cpu::plan_threads(opts.get_int("threads"), opts.get_int("blas_threads"),
                                              opts.get_bool("pin"), r, local, budget);
      std::ostringstream os;
      os << "local rank " << r << ": intra-op " << (plan.intra_op ? std::to_string(plan.intra_op) : "default")
         << ", inter-op " << (plan.inter_op ? std::to_string(plan.inter_op) : "default") << ", BLAS "
         << (plan.blas ? std::to_string(plan.blas) : "default") << ", "
         << (plan.pin.empty() ? std::string("not pinned")
                             : (plan.pin.size() == 1 ? "CPU " : "CPUs ") + v1::cpu::cpu_list_text(plan.pin))
         << " (" << plan.reason << ")";
      lines.push_back(os.str());
    }
  } else {
    lines.push_back("threads: accelerator '" + job.accelerator.plugin +
                    "' manages its own (no threads/blas_threads/pin options)");
  }
  std::string found;
  for (const auto& a : accelerators) found += (found.empty() ? "" : ", ") + a;
  lines.push_back("backends found: " + (found.empty() ? std::string("none") : found));
  return lines;
}

}  // namespace trainrun::core
