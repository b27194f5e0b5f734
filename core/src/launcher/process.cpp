// The processes the node agent starts (process.hpp).
#include "process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <trainrun/error.hpp>

extern char** environ;

namespace trainrun::core::launcher {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string fixed1(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "?";
  return buf;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// "exited with code 2", "was killed by signal 9 (SIGKILL)"; the exit code a shell would show.
std::pair<std::string, int> describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return {"was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")",
            128 + sig};
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  return {"exited with code " + std::to_string(code), code};
}

std::vector<std::string> worker_env(const std::vector<std::pair<std::string, std::string>>& add) {
  static const std::set<std::string> owned = {"RANK",
                                              "WORLD_SIZE",
                                              "LOCAL_RANK",
                                              "LOCAL_WORLD_SIZE",
                                              "GROUP_RANK",
                                              "MASTER_ADDR",
                                              "MASTER_PORT",
                                              "TRAINRUN_AGENT_STORE",
                                              "TRAINRUN_RUN_DIR_READY",
                                              "TRAINRUN_TTY",
                                              "TRAINRUN_RENDEZVOUS_TIMEOUT_S",
                                              "TRAINRUN_CONTROL_FD"};
  std::set<std::string> added;
  for (const auto& [k, v] : add) added.insert(k);
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv(*e);
    const std::string key = kv.substr(0, kv.find('='));
    if (!owned.count(key) && !added.count(key)) out.push_back(kv);
  }
  for (const auto& [k, v] : add) out.push_back(k + "=" + v);
  return out;
}

namespace {

void write_decimal(int fd, int v) {
  char buf[16];
  int i = sizeof buf;
  buf[--i] = '\n';
  do buf[--i] = static_cast<char>('0' + v % 10);
  while ((v /= 10) > 0 && i > 0);
  [[maybe_unused]] ssize_t n = write(fd, buf + i, sizeof buf - i);
}

struct Pipe {
  int r = -1, w = -1;
  Pipe() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
      throw v1::Error(std::string("launcher: pipe2: ") + std::strerror(errno));
    r = fds[0], w = fds[1];
  }
};

}  // namespace

pid_t spawn(ExecImage& image, int* out, int* err, int* control) {
  Pipe po, pe;
  std::optional<Pipe> pc;
  if (control) pc.emplace();
  const int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    close(po.r), close(po.w), close(pe.r), close(pe.w), close(devnull);
    if (pc) close(pc->r), close(pc->w);
    throw v1::Error(std::string("launcher: fork: ") + std::strerror(e));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec: other threads (the store's) may have held
    // locks at fork time.
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent) _exit(127);
    setpgid(0, 0);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    dup2(po.w, STDOUT_FILENO);
    dup2(pe.w, STDERR_FILENO);
    if (pc) {
      // dup2 onto itself keeps FD_CLOEXEC, so that case clears it by hand.
      if (pc->w == kControlFd)
        fcntl(kControlFd, F_SETFD, 0);
      else
        dup2(pc->w, kControlFd);
    }
    syscall(SYS_close_range, pc ? 4U : 3U, ~0U, 0U);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    // The handlers the agent installed; anything else (nohup's SIGHUP) stays as inherited.
    for (int s : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) sigaction(s, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execvpe(image.argv[0], image.argv.data(), image.envp.data());
    const int e = errno;
    [[maybe_unused]] ssize_t n =
        write(STDERR_FILENO, image.exec_error.data(), image.exec_error.size());
    write_decimal(STDERR_FILENO, e);
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so a stop sent right away reaches the group
  close(po.w), close(pe.w);
  if (devnull >= 0) close(devnull);
  *out = po.r;
  *err = pe.r;
  if (pc) {
    close(pc->w);
    fcntl(pc->r, F_SETFL, O_NONBLOCK);
    *control = pc->r;
  }
  return pid;
}

}  // namespace trainrun::core::launcher
