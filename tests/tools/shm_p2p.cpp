// gloo-cpu's shared-memory send/recv (plugins/lib/comm-gloo/shm.cpp), driven directly: this program
// forks its ranks, each builds a GlooCommunicator over a loopback store and TCP device (as the
// accelerator does), and runs one mode:
//   shm_p2p check [N]   correctness at N ranks (default 2): the shm path is in use; exchanges
//                       around the ring for every dtype and sizes 0, 1, 7, 1000003 and one
//                       larger than a channel's ring; 64 chunk messages posted ahead (as a
//                       pipelined ring all-reduce does); recv_reduce (sum/min/max, five dtypes,
//                       several sizes); a send nobody waits for (2 ranks); a send after an
//                       all_reduce of the same tensor; a sub-group; the same with shm=false.
//   shm_p2p mismatch    rank 1's recv names another tag and size than rank 0's send: an error
//                       naming both ranks, both tags and both sizes, on rank 1 at once.
//   shm_p2p dead        rank 0 dies (SIGKILL) while rank 1 waits in a recv with a 60 s
//                       timeout: rank 1's recv fails within seconds naming rank 0.
//   shm_p2p timeout     rank 1's recv with timeout_s 1 and no send: fails in about 1 s.
//   shm_p2p bench [SIZES] 2 ranks: ping-pong and exchange of 4 KiB..64 MiB, shm vs TCP, GB/s.
// Exit code 0 on success; each rank prints what failed.
#include <trainrun/interfaces.hpp>

#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "comm_common.hpp"
#include "gloo_communicator.hpp"

using namespace trainrun;
using trainrun::plugins::GlooCommunicator;
using trainrun::plugins::GlooSettings;
using Clock = std::chrono::steady_clock;

namespace {

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  close(s);
  return ntohs(a.sin_port);
}

std::shared_ptr<c10d::Store> the_store;

// A communicator of all ranks; `id` "" for the first, another for a second one on the same
// store (e.g. "9": TCP only, to compare with).
std::unique_ptr<GlooCommunicator> connect(int port, int rank, int n, bool shm, double timeout_s,
                                          const std::string& id = "") {
  if (!the_store) the_store = comm::open_store({"127.0.0.1", port, false}, rank, n, 60);
  auto store = the_store;
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  GlooSettings s;
  s.timeout_s = timeout_s;
  s.stall_warning_s = 0;
  s.rendezvous_timeout_s = 60;
  s.shm = shm;
  std::vector<int> world(n);
  for (int r = 0; r < n; ++r) world[r] = r;
  return std::make_unique<GlooCommunicator>(store, gloo::transport::tcp::CreateDevice(attr), s,
                                            id, id.empty() ? "world" : id, world, rank);
}

int failures = 0;
void expect(bool ok, int rank, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cerr << "rank " << rank << ": FAILED: " << what << std::endl;
  }
}

// Values that differ by rank, position and dtype, exact in every dtype.
at::Tensor pattern(int rank, int64_t n, c10::ScalarType t) {
  return (torch::arange(n, torch::kLong) * 7 + rank * 13).remainder(101).to(t);
}

const std::vector<c10::ScalarType> kDtypes = {torch::kFloat, torch::kDouble, torch::kBFloat16,
                                              torch::kHalf, torch::kInt, torch::kLong,
                                              torch::kByte};

// Everyone sends `count` elements to the next rank and receives from the previous one.
void ring_exchange(v1::Communicator& c, int64_t count, c10::ScalarType t, int tag,
                   const std::string& what) {
  const int n = c.world_size(), r = c.rank();
  auto out = pattern(r, count, t);
  auto in = torch::zeros({count}, out.options());
  auto ws = c.send(out, {(r + 1) % n, tag, 0});
  auto wr = c.recv(in, {(r + n - 1) % n, tag, 0});
  ws->wait();
  wr->wait();
  expect(in.equal(pattern((r + n - 1) % n, count, t)), r, what);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// Everyone sends its pattern to the next rank and combines what the previous rank sent into its
// own pattern with recv_reduce (ABI 1.5).
void ring_recv_reduce(GlooCommunicator& c, int64_t count, c10::ScalarType t, v1::ReduceOp op,
                      const std::string& what) {
  const int n = c.world_size(), r = c.rank(), left = (r + n - 1) % n;
  auto out = pattern(r, count, t);
  auto acc = pattern(r, count, t) * 2;  // differs from what is sent, so min/max both matter
  auto mine = acc.clone();
  auto ws = c.send(out, {(r + 1) % n, 11, 0});
  auto wr = c.recv_reduce(acc, op, {left, 11, 0});
  ws->wait();
  wr->wait();
  const auto theirs = pattern(left, count, t);
  const auto want = op == v1::ReduceOp::Sum   ? mine + theirs
                    : op == v1::ReduceOp::Min ? at::minimum(mine, theirs)
                                              : at::maximum(mine, theirs);
  expect(acc.equal(want), r, what);
}

int check(GlooCommunicator& c, bool shm) {
  const int n = c.world_size(), r = c.rank();
  if (shm) expect(c.shm_peers() == n - 1, r, "shm_peers() " + std::to_string(c.shm_peers()));
  // Single copy (process_vm_readv) is on only with TRAINRUN_SHM_CMA=1 (shm.p2p.check.single_copy);
  // where the system forbids it, the transport said why on stderr, and this fails.
  const char* cma = std::getenv("TRAINRUN_SHM_CMA");
  const int want_single = shm && cma && std::string(cma) == "1" ? n - 1 : 0;
  expect(c.shm_single_copy_peers() == want_single, r,
         "shm_single_copy_peers() " + std::to_string(c.shm_single_copy_peers()) + ", expected " +
             std::to_string(want_single));
  if (!shm) expect(c.shm_peers() == 0, r, "shm=false but shm_peers() > 0");
  for (auto t : kDtypes)
    for (int64_t count : {0L, 1L, 7L, 1000003L})
      ring_exchange(c, count, t, 7, "exchange " + std::string(v1::dtype_name(t)) + " x " +
                                       std::to_string(count));
  // Larger than a channel's ring (4 MiB by default): streams while the peer copies out.
  ring_exchange(c, 9'000'001, torch::kFloat, 3, "exchange float32 x 9000001");
  // 64 chunks of 256 KiB posted ahead to the same peer with the same tag, then waited on.
  {
    const int64_t chunk = 65536, k = 64;
    auto out = pattern(r, chunk * k, torch::kFloat);
    auto in = torch::zeros_like(out);
    std::vector<std::shared_ptr<v1::Work>> works;
    for (int64_t i = 0; i < k; ++i) {
      auto so = out.slice(0, i * chunk, (i + 1) * chunk);
      auto ri = in.slice(0, i * chunk, (i + 1) * chunk);
      works.push_back(c.recv(ri, {(r + n - 1) % n, 5, 0}));
      works.push_back(c.send(so, {(r + 1) % n, 5, 0}));
    }
    for (auto& w : works) w->wait();
    expect(in.equal(pattern((r + n - 1) % n, chunk * k, torch::kFloat)), r, "64 chunks posted ahead");
  }
  // recv_reduce: every reduction, the dtypes with plain loops and those through ATen, empty,
  // odd and multi-slot sizes; one larger than a channel's ring.
  for (auto op : {v1::ReduceOp::Sum, v1::ReduceOp::Min, v1::ReduceOp::Max})
    for (auto t : {torch::kFloat, torch::kDouble, torch::kBFloat16, torch::kInt, torch::kLong})
      for (int64_t count : {0L, 1L, 7L, 300001L})
        ring_recv_reduce(c, count, t, op, "recv_reduce " + std::to_string(static_cast<int>(op)) +
                                              " " + v1::dtype_name(t) + " x " + std::to_string(count));
  ring_recv_reduce(c, 9'000'001, torch::kFloat, v1::ReduceOp::Sum, "recv_reduce float32 x 9000001");
  // NaN on either side wins under min/max, as ATen's minimum/maximum (the ring's reduction
  // without recv_reduce) have it: through the slots (7) and by single copy (600001, 2.4 MB).
  for (auto op : {v1::ReduceOp::Min, v1::ReduceOp::Max})
    for (int64_t count : {7L, 600001L}) {
      const int left = (r + n - 1) % n;
      auto with_nan = [&](int rank) {
        auto t = pattern(rank, count, torch::kFloat);
        t.index_put_({torch::arange(rank % 2, count, 3)}, std::nanf(""));
        return t;
      };
      auto acc = with_nan(r), mine = acc.clone();
      auto ws = c.send(with_nan(r), {(r + 1) % n, 14, 0});
      auto wr = c.recv_reduce(acc, op, {left, 14, 0});
      ws->wait();
      wr->wait();
      const auto want = op == v1::ReduceOp::Min ? at::minimum(mine, with_nan(left))
                                                : at::maximum(mine, with_nan(left));
      expect(at::allclose(acc, want, 0, 0, /*equal_nan=*/true), r,
             "recv_reduce NaN " + std::to_string(static_cast<int>(op)) + " x " + std::to_string(count));
    }
  expect(error_of([&] {
           auto t = torch::zeros({4});
           c.recv_reduce(t, v1::ReduceOp::Avg, {(r + n - 1) % n, 12, 0});
         }).find("Avg") != std::string::npos,
         r, "recv_reduce with Avg is refused");
  // A send nobody waits for still completes (the transport's background thread drives it):
  // rank 0 only waits in a barrier, rank 1 waits for the message first.
  if (n == 2) {
    auto out = pattern(r, 300001, torch::kFloat);
    auto in = torch::zeros_like(out);
    std::shared_ptr<v1::Work> ws;
    if (r == 0) {
      ws = c.send(out, {1, 13, 0});
    } else {
      c.recv(in, {0, 13, 0})->wait();
      expect(in.equal(pattern(0, 300001, torch::kFloat)), r, "send nobody waits for");
    }
    c.barrier()->wait();
    // The barrier only orders the receiver's read before this point; the send's own completion
    // (the receiver's ack seen by this rank) is the background thread's to notice, so it gets a
    // few seconds rather than none (a single-copy send raced here: its ack can land after the
    // barrier's wait stopped polling).
    if (ws) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!ws->completed() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      expect(ws->completed(), r, "send nobody waits for: not completed 10 s after the barrier");
    }
  }
  // A send issued after an all_reduce of the same tensor, without a wait in between, sends
  // the reduced values (issue order).
  {
    auto t = torch::full({1000}, static_cast<float>(r + 1));
    auto in = torch::zeros({1000});
    c.all_reduce(t);
    auto ws = c.send(t, {(r + 1) % n, 9, 0});
    auto wr = c.recv(in, {(r + n - 1) % n, 9, 0});
    ws->wait();
    wr->wait();
    expect(in.equal(torch::full({1000}, n * (n + 1) / 2.0f)), r, "send after all_reduce");
  }
  // A sub-group in reverse order: group ranks differ from global ranks.
  {
    std::vector<int> rev;
    for (int i = n - 1; i >= 0; --i) rev.push_back(i);
    auto sub = c.new_group(rev);
    auto& g = dynamic_cast<GlooCommunicator&>(*sub);
    if (shm) expect(g.shm_peers() == n - 1, r, "sub-group shm_peers()");
    ring_exchange(g, 100003, torch::kDouble, 1, "sub-group exchange");
    g.barrier()->wait();
  }
  c.barrier()->wait();
  return failures;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void print_row(const char* what, int64_t bytes, double pp_tcp, double pp_shm, double ex_tcp,
               double ex_shm) {
  std::printf("%-4s %10lld  %9.2f %9.2f   %9.2f %9.2f\n", what, static_cast<long long>(bytes),
              pp_tcp, pp_shm, ex_tcp, ex_shm);
  std::fflush(stdout);
}

// GB/s of a 2-rank ping-pong (bytes each way per round trip / half the round trip) and of an
// exchange (both send `bytes` at once; bytes per direction / time).
std::pair<double, double> measure(GlooCommunicator& c, int64_t bytes) {
  const int r = c.rank(), peer = 1 - r;
  auto out = torch::ones({bytes}, torch::kByte);
  auto in = torch::zeros({bytes}, torch::kByte);
  const int iters = static_cast<int>(std::max<int64_t>(5, std::min<int64_t>(2000, (512LL << 20) / std::max<int64_t>(bytes, 1))));
  auto pingpong = [&] {
    if (r == 0) {
      c.send(out, {peer, 1, 0})->wait();
      c.recv(in, {peer, 1, 0})->wait();
    } else {
      c.recv(in, {peer, 1, 0})->wait();
      c.send(out, {peer, 1, 0})->wait();
    }
  };
  auto exchange = [&] {
    auto ws = c.send(out, {peer, 2, 0});
    auto wr = c.recv(in, {peer, 2, 0});
    ws->wait();
    wr->wait();
  };
  auto time = [&](const std::function<void()>& f) {
    for (int i = 0; i < 3; ++i) f();
    c.barrier()->wait();
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) f();
    return std::chrono::duration<double>(Clock::now() - t0).count() / iters;
  };
  const double pp = time(pingpong);
  const double ex = time(exchange);
  return {2.0 * bytes / pp / 1e9, bytes / ex / 1e9};
}

int run_rank(const std::string& mode, int rank, int n, int port, const std::vector<int64_t>& sizes) {
  if (mode == "check") {
    auto c = connect(port, rank, n, true, 120);
    check(*c, true);
    auto t = connect(port, rank, n, false, 120, "9");
    return check(*t, false);
  }
  if (mode == "mismatch") {
    auto c = connect(port, rank, n, true, 60);
    if (rank == 0) {
      auto t = torch::ones({10});
      auto w = c->send(t, {1, 1, 0});
      // The peer fails and aborts the channel: this send either completed (it fits) or fails.
      try { w->wait(); } catch (const std::exception&) {}
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return 0;
    }
    auto t = torch::zeros({12});
    const auto t0 = Clock::now();
    const std::string e = error_of([&] { c->recv(t, {0, 2, 0})->wait(); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cout << "rank 1 error: " << e << std::endl;
    expect(s < 5, rank, "mismatch took " + std::to_string(s) + " s");
    for (const char* part : {"recv(float32 x 12, 48 B) from rank 0, tag 2", "sent to rank 1",
                             "float32 x 10, 40 B, tag 1"})
      expect(contains(e, part), rank, std::string("error does not say '") + part + "'");
    // The communicator is poisoned: the next call throws the same error at once.
    expect(contains(error_of([&] { c->barrier(); }), "tag 1"), rank, "not poisoned");
    return failures;
  }
  if (mode == "dead") {
    auto c = connect(port, rank, n, true, 60);
    c->barrier()->wait();
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      kill(getpid(), SIGKILL);
    }
    auto t = torch::zeros({1000});
    const auto t0 = Clock::now();
    const std::string e = error_of([&] { c->recv(t, {0, 4, 0})->wait(); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cout << "rank 1 error after " << s << " s: " << e << std::endl;
    expect(s < 5, rank, "the dead peer was noticed after " + std::to_string(s) + " s");
    expect(contains(e, "from rank 0, tag 4") && contains(e, "rank 0 (pid"), rank,
           "error does not name rank 0 and the recv");
    return failures;
  }
  if (mode == "timeout") {
    auto c = connect(port, rank, n, true, 60);
    c->barrier()->wait();
    if (rank == 0) {
      // Longer than rank 1's widest accepted wait, so its recv can only end by timing out.
      std::this_thread::sleep_for(std::chrono::milliseconds(8000));
      return 0;
    }
    auto t = torch::zeros({1000});
    const auto t0 = Clock::now();
    const std::string e = error_of([&] { c->recv(t, {0, 4, 1.0})->wait(); });
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::cout << "rank 1 error after " << s << " s: " << e << std::endl;
    // A 1 s timeout: never early; late by up to 5 s when ctest -j2 loads the 2 cores (the
    // property under test is that it ends by itself, naming the peer, not its exact latency).
    expect(s > 0.9 && s < 6.0, rank, "timeout after " + std::to_string(s) + " s");
    expect(contains(e, "from rank 0, tag 4") && contains(e, "timed out"), rank,
           "error does not name the recv and the timeout");
    return failures;
  }
  if (mode == "bench") {
    auto shm = connect(port, rank, n, true, 600);
    auto tcp = connect(port, rank, n, false, 600, "9");
    if (rank == 0) {
      std::printf("# %s; %s\n", shm->shm_peers() ? "shm active" : "shm NOT active",
                  std::getenv("TRAINRUN_SHM_SLOT_BYTES") ? std::getenv("TRAINRUN_SHM_SLOT_BYTES") : "default slots");
      std::printf("# GB/s     bytes   pingpong: tcp       shm   exchange: tcp       shm  (per direction)\n");
    }
    for (int64_t b : sizes) {
      const auto t = measure(*tcp, b);
      const auto m = measure(*shm, b);
      if (rank == 0) print_row("", b, t.first, m.first, t.second, m.second);
    }
    return 0;
  }
  std::cerr << "unknown mode " << mode << std::endl;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  int n = mode == "check" && argc > 2 ? std::atoi(argv[2]) : 2;
  std::vector<int64_t> sizes;
  if (mode == "bench") {
    for (int64_t s = 4096; s <= (64LL << 20); s *= 4) sizes.push_back(s);
    if (argc > 2) {
      sizes.clear();
      for (int i = 2; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
    }
  }
  const int port = free_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t p = fork();
    if (p == 0) {
      int rc = 1;
      try {
        rc = run_rank(mode, r, n, port, sizes);
      } catch (const std::exception& e) {
        std::cerr << "rank " << r << ": " << e.what() << std::endl;
      }
      std::fflush(stdout);
      _exit(rc);
    }
    pids.push_back(p);
  }
  int bad = 0;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    const bool killed_on_purpose = mode == "dead" && r == 0 && WIFSIGNALED(status);
    if (!killed_on_purpose && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      std::cerr << "rank " << r << " failed (status " << status << ")" << std::endl;
      ++bad;
    }
  }
  std::cout << "shm_p2p " << mode << ": " << (bad ? "FAILED" : "ok") << std::endl;
  return bad ? 1 : 0;
}
