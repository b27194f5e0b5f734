// `trainrun bench collectives`: an nccl-tests-style bandwidth table for a collective backend,
// with a correctness check per row, and `--verify`, the correctness matrix the tests run (every
// operation x dtype x reduce op x size, sub-groups, point-to-point, precondition errors).
//
// With --nproc N > 1 and no launcher around it, the command launches N copies of itself through
// the trainrun launcher (mpiexec for the mpi backend); each copy builds the backend's
// accelerator from the environment exactly as a training job does.
//
// Bandwidth follows nccl-tests (doc/PERFORMANCE.md there): algbw = size / time, and
// busbw = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for reduce-scatter and all-gather (whose
// size is the full, world-sized buffer) and all-to-all (size: one rank's input, a part for every
// rank), x 1 for broadcast. time is the mean over --iters,
// maximum over ranks (--stat median|min: of the iterations timed one by one).
#include "collectives.hpp"
#include "command_line.hpp"
#include "commands.hpp"

#include <boost/program_options.hpp>
#include <torch/types.h>
#include <torch/utils.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <thread>

#include "trainrun/collectives/all_to_all.hpp"
#include "trainrun/collectives/ring.hpp"
#include "trainrun/core/config.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/registry.hpp"

namespace trainrun::app {

namespace po = boost::program_options;
using core::Registry;
using v1::ReduceOp;

namespace {

struct Args {
  std::string backend = "gloo-cpu";
  int nproc = 1;
  std::string op = "allreduce";
  std::string dtype = "float32";
  std::string reduce = "sum";
  std::string sizes = "4K:256M";
  std::string counts;
  int iters = 20;
  int warmup = 5;
  std::string stat = "mean";
  bool check = true;
  bool verify = false;
  std::string inject;
  std::string label;
  std::string algo = "native";
  std::string chunk = "4M";
  int fusion = 0;
  std::vector<std::string> sets;
  std::vector<std::string> plugin_paths;
};

const std::vector<std::string> kOps = {"allreduce", "reducescatter", "allgather", "broadcast",
                                       "alltoall"};
const std::vector<std::string> kDtypes = {"float32", "float64", "bfloat16", "float16",
                                          "int32",   "int64",   "uint8"};
const std::vector<std::string> kReduces = {"sum", "avg", "min", "max"};

c10::ScalarType dtype_of(const std::string& s) {
  if (s == "float32") return torch::kFloat;
  if (s == "float64") return torch::kDouble;
  if (s == "bfloat16") return torch::kBFloat16;
  if (s == "float16") return torch::kHalf;
  if (s == "int32") return torch::kInt;
  if (s == "int64") return torch::kLong;
  if (s == "uint8") return torch::kByte;
  if (s == "int16") return torch::kShort;  // unsupported on purpose: --verify expects an error
  throw v1::ConfigError("--dtype " + s + ": not one of float32, float64, bfloat16, float16, "
                        "int32, int64, uint8");
}

ReduceOp reduce_of(const std::string& s) {
  if (s == "sum") return ReduceOp::Sum;
  if (s == "avg") return ReduceOp::Avg;
  if (s == "min") return ReduceOp::Min;
  if (s == "max") return ReduceOp::Max;
  throw v1::ConfigError("--reduce " + s + ": not one of sum, avg, min, max");
}

std::vector<std::string> expand(const std::string& value, const std::vector<std::string>& all,
                                const char* flag) {
  if (value == "all") return all;
  std::vector<std::string> out;
  std::stringstream ss(value);
  for (std::string item; std::getline(ss, item, ',');) {
    if (std::find(all.begin(), all.end(), item) == all.end())
      throw v1::ConfigError(std::string(flag) + " " + item + ": not a known value");
    out.push_back(item);
  }
  return out;
}

// "4K:256M" doubles from 4 KiB to 256 MiB; "1K,1M" is a list.
std::vector<int64_t> parse_sizes(const std::string& text) {
  std::vector<int64_t> out;
  const auto colon = text.find(':');
  try {
    if (colon != std::string::npos) {
      int64_t lo = core::parse_size(text.substr(0, colon));
      const int64_t hi = core::parse_size(text.substr(colon + 1));
      if (lo <= 0 || hi < lo) throw std::invalid_argument("need 0 < first <= last");
      for (; lo <= hi; lo *= 2) out.push_back(lo);
    } else {
      std::stringstream ss(text);
      for (std::string item; std::getline(ss, item, ',');) out.push_back(core::parse_size(item));
    }
  } catch (const std::invalid_argument& e) {
    throw v1::ConfigError("--sizes " + text + ": " + e.what());
  }
  return out;
}

std::vector<int64_t> parse_counts(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (!end || *end || v < 0) throw v1::ConfigError("--counts " + text + ": '" + item + "' is not a count");
    out.push_back(v);
  }
  return out;
}

// Accelerator options: the component's defaults, with --set accelerator.KEY=VALUE applied.
v1::Options accelerator_options(const core::ComponentInfo& info, const std::vector<std::string>& sets) {
  std::map<std::string, v1::OptionValue> values;
  for (const auto& s : info.schema.specs()) values[s.name] = s.default_value;
  for (const auto& kv : sets) {
    const auto eq = kv.find('=');
    const std::string prefix = "accelerator.";
    if (eq == std::string::npos || kv.rfind(prefix, 0) != 0)
      throw v1::ConfigError("--set " + kv + ": expected accelerator.KEY=VALUE");
    const std::string key = kv.substr(prefix.size(), eq - prefix.size());
    const std::string text = kv.substr(eq + 1);
    const v1::OptionSpec* spec = nullptr;
    for (const auto& s : info.schema.specs())
      if (s.name == key) spec = &s;
    if (!spec) throw v1::ConfigError("--set " + kv + ": accelerator '" + info.name + "' has no option '" + key + "'");
    try {
      switch (spec->type) {
        case v1::OptionType::Bool:
          if (text != "true" && text != "false") throw std::invalid_argument("expected true or false");
          values[key] = text == "true";
          break;
        case v1::OptionType::Int: values[key] = static_cast<int64_t>(std::stoll(text)); break;
        case v1::OptionType::IntOrAuto:
          values[key] = text == "auto" ? v1::kAuto : static_cast<int64_t>(std::stoll(text));
          break;
        case v1::OptionType::Float: values[key] = std::stod(text); break;
        case v1::OptionType::Size: values[key] = core::parse_size(text); break;
        case v1::OptionType::Duration: values[key] = core::parse_duration(text); break;
        case v1::OptionType::String:
        case v1::OptionType::Choice: values[key] = text; break;
        case v1::OptionType::IntList: {
          // "[0, 0]" or "0,0" (cuda's device_ids: two ranks sharing one GPU).
          std::vector<int64_t> ids;
          std::string item;
          for (char ch : text + ",") {
            if (ch == ',') {
              if (!item.empty()) ids.push_back(std::stoll(item));
              item.clear();
            } else if (ch != '[' && ch != ']' && ch != ' ') {
              item += ch;
            }
          }
          values[key] = ids;
          break;
        }
        default: throw std::invalid_argument("string-list options cannot be set here");
      }
    } catch (const std::exception& e) {
      throw v1::ConfigError("--set " + kv + ": " + e.what());
    }
  }
  return v1::Options(values, "[accelerator] " + info.name);
}

// Rank r's input: small integers (1..11), exact in every dtype, so sums over 4 ranks and their
// averages compare exactly or within one rounding of the dtype.
// The accelerator's device: every tensor the bench hands the communicator lives there (a cuda
// accelerator's communicators take device tensors only).
c10::Device g_device(c10::kCPU);

torch::Tensor input_of(int rank, int64_t count, c10::ScalarType dtype, int64_t offset = 0) {
  auto i = torch::arange(offset, offset + count, torch::kLong);
  return ((i * 7 + rank * 3).remainder(11) + 1).to(dtype).to(g_device);
}

torch::Tensor reduce_reference(const std::vector<int>& ranks, int64_t count, int64_t offset,
                               ReduceOp op, c10::ScalarType dtype) {
  torch::Tensor acc;
  for (int r : ranks) {
    auto x = input_of(r, count, torch::kDouble, offset);
    if (!acc.defined()) acc = x;
    else if (op == ReduceOp::Min) acc = torch::minimum(acc, x);
    else if (op == ReduceOp::Max) acc = torch::maximum(acc, x);
    else acc = acc + x;
  }
  if (op == ReduceOp::Avg) {
    acc = acc / static_cast<double>(ranks.size());
    if (!c10::isFloatingType(dtype)) acc = acc.trunc();
  }
  return acc;
}

// Largest absolute difference, or -1 when within tolerance (half types round averages).
double mismatch(const torch::Tensor& got, const torch::Tensor& want) {
  if (got.numel() != want.numel()) return std::numeric_limits<double>::infinity();
  if (got.numel() == 0) return -1;
  auto g = got.to(torch::kCPU).to(torch::kDouble).view(-1);
  auto w = want.to(torch::kCPU).to(got.scalar_type()).to(torch::kDouble).view(-1);
  const double err = (g - w).abs().max().item<double>();
  return err == 0 ? -1 : err;
}

struct Ctx {
  v1::Communicator* comm;
  int rank, world;
  Args args;
  int failures = 0;
  int checks = 0;
};

void report(Ctx& c, bool ok, const std::string& what) {
  ++c.checks;
  if (!ok) {
    ++c.failures;
    std::cout << "FAIL rank " << c.rank << ": " << what << std::endl;
  }
}

// Runs one operation on fresh inputs and checks it against the reference; returns the
// operation's result check (true = correct).
// All-reduce with the backend's own algorithm, or (--algo ring) with the SDK's ring over the
// backend's send/recv, the algorithm the `ring` strategy runs.
void all_reduce_with(const Ctx& c, v1::Communicator& comm, torch::Tensor& t, ReduceOp rop) {
  if (c.args.algo == "ring") {
    v1::ring::Options o;
    o.op = rop;
    o.chunk_bytes = core::parse_size(c.args.chunk);
    v1::ring::all_reduce(comm, t, o);
    return;
  }
  v1::AllReduceOptions o;
  o.op = rop;
  comm.all_reduce(t, o)->wait();
}

bool run_checked(Ctx& c, v1::Communicator& comm, const std::vector<int>& members,
                 const std::string& op, c10::ScalarType dtype, ReduceOp rop, int64_t count,
                 int root, std::string* detail) {
  const int me = members[comm.rank()];  // global rank of this process
  const int n = comm.world_size();
  torch::Tensor want, got;
  if (op == "allreduce") {
    got = input_of(me, count, dtype);
    all_reduce_with(c, comm, got, rop);
    want = reduce_reference(members, count, 0, rop, dtype);
  } else if (op == "reducescatter") {
    auto in = input_of(me, count * n, dtype);
    got = torch::empty({count}, in.options());
    v1::ReduceScatterOptions o;
    o.op = rop;
    comm.reduce_scatter(in, got, o)->wait();
    want = reduce_reference(members, count, count * comm.rank(), rop, dtype);
  } else if (op == "allgather") {
    auto in = input_of(me, count, dtype);
    got = torch::empty({count * n}, in.options());
    comm.all_gather(in, got)->wait();
    std::vector<torch::Tensor> parts;
    for (int r : members) parts.push_back(input_of(r, count, torch::kDouble));
    want = torch::cat(parts);
  } else if (op == "alltoall") {
    // Uneven parts (ABI 1.13): group rank r sends rank p part(r, p) rows, count / 2, count or
    // 3 count / 2 (0 for count 1), each valued by its sender and receiver.
    const int g = comm.rank();
    auto part = [count](int r, int p) { return count * (1 + (r + 2 * p) % 3) / 2; };
    auto values = [](int from, int to, int64_t rows, c10::ScalarType t) {
      auto i = torch::arange(rows, torch::kLong);
      return ((i * 5 + from * 3 + to * 7).remainder(11) + 1).to(t).to(g_device);
    };
    std::vector<torch::Tensor> in, expect;
    v1::AllToAllOptions o;
    for (int p = 0; p < n; ++p) {
      in.push_back(values(me, members[p], part(g, p), dtype));
      expect.push_back(values(members[p], me, part(p, g), torch::kDouble));
      o.input_split_sizes.push_back(part(g, p));
      o.output_split_sizes.push_back(part(p, g));
    }
    const torch::Tensor input = torch::cat(in);
    got = torch::full({torch::cat(expect).numel()}, 99, input.options());
    v1::all_to_all(comm, input, got, o);
    want = torch::cat(expect);
  } else if (op == "broadcast") {
    got = input_of(me, count, dtype);
    v1::BroadcastOptions o;
    o.root = root;
    comm.broadcast(got, o)->wait();
    want = input_of(members[root], count, torch::kDouble);
  } else {
    throw v1::Error("unknown op " + op);
  }
  const double err = mismatch(got, want);
  if (err >= 0 && detail) {
    std::ostringstream os;
    os << "max abs error " << err;
    *detail = os.str();
  }
  return err < 0;
}

std::string label(const std::string& op, const std::string& dtype, const std::string& red,
                  int64_t count, const std::string& extra = "") {
  std::ostringstream os;
  os << op << " " << dtype << (op == "allreduce" || op == "reducescatter" ? " " + red : "")
     << " count " << count << extra;
  return os.str();
}

template <class F>
void expect_error(Ctx& c, const std::string& what, const std::string& needle, F&& fn) {
  try {
    fn();
    report(c, false, what + ": no error was raised");
  } catch (const std::exception& e) {
    const std::string msg = e.what();
    report(c, msg.find(needle) != std::string::npos,
           what + ": error does not mention '" + needle + "': " + msg);
  }
}

// A barrier must not let any rank leave before the last one entered. Rank 0 enters 200 ms
// late; every rank's exit must come after every rank's entry. steady_clock (CLOCK_MONOTONIC) is
// comparable across processes only within one boot of one host, so the check is made when every
// rank reads the same /proc boot_id, and left out (not counted) otherwise.
void check_barrier(Ctx& c, v1::Communicator& comm) {
  const auto now = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  if (c.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double enter = now();
  comm.barrier()->wait();
  const double leave = now();
  const int n = c.world;
  auto times = torch::tensor({enter, leave}, torch::kDouble);
  auto all_times = torch::empty({2 * n}, torch::kDouble);
  comm.all_gather(times, all_times)->wait();
  auto id = torch::tensor({static_cast<int64_t>(std::hash<std::string>{}(boot))}, torch::kLong);
  auto ids = torch::empty({n}, torch::kLong);
  comm.all_gather(id, ids)->wait();
  if (boot.empty() || (ids != ids[0]).any().item<bool>()) return;
  const auto t = all_times.view({n, 2});
  const double last_enter = t.select(1, 0).max().item<double>();
  const double first_leave = t.select(1, 1).min().item<double>();
  std::ostringstream os;
  os << "barrier: a rank left " << (last_enter - first_leave) * 1e3
     << " ms before the last rank entered";
  report(c, first_leave >= last_enter, os.str());
}

int verify(Ctx& c, const std::vector<int64_t>& counts) {
  auto& comm = *c.comm;
  const int n = c.world;
  std::vector<int> world_ranks(n);
  for (int r = 0; r < n; ++r) world_ranks[r] = r;
  const auto ops = expand(c.args.op, kOps, "--op");
  const auto dtypes = expand(c.args.dtype, kDtypes, "--dtype");
  const auto reduces = expand(c.args.reduce, kReduces, "--reduce");
  for (const auto& op : ops)
    for (const auto& dt : dtypes)
      for (int64_t count : counts) {
        const bool reducing = op == "allreduce" || op == "reducescatter";
        const std::vector<std::string> reds = reducing ? reduces : std::vector<std::string>{"-"};
        for (const auto& red : reds) {
          const int roots = op == "broadcast" ? n : 1;
          for (int root = 0; root < roots; ++root) {
            std::string detail;
            const bool ok = run_checked(c, comm, world_ranks, op, dtype_of(dt),
                                        reducing ? reduce_of(red) : ReduceOp::Sum, count, root,
                                        &detail);
            report(c, ok, label(op, dt, red, count,
                                op == "broadcast" ? " root " + std::to_string(root) : "") +
                              ": " + detail);
          }
        }
      }
  // Point-to-point around the ring: everyone sends to the next rank and receives from the
  // previous one, both posted before either is waited on.
  if (n > 1) {
    for (const auto& dt : dtypes)
      for (int64_t count : counts) {
        auto out = input_of(c.rank, count, dtype_of(dt));
        auto in = torch::zeros({count}, out.options());
        v1::PointToPointOptions so, ro;
        so.peer = (c.rank + 1) % n;
        ro.peer = (c.rank + n - 1) % n;
        so.tag = ro.tag = 7;
        auto ws = comm.send(out, so);
        auto wr = comm.recv(in, ro);
        ws->wait();
        wr->wait();
        const double err = mismatch(in, input_of(ro.peer, count, torch::kDouble));
        report(c, err < 0, "send/recv " + dt + " count " + std::to_string(count));
      }
  }
  check_barrier(c, comm);
  // Sub-groups: the even ranks, and every rank in reverse order (group rank != global rank).
  {
    std::vector<int> even, reversed;
    for (int r = 0; r < n; r += 2) even.push_back(r);
    for (int r = n - 1; r >= 0; --r) reversed.push_back(r);
    for (const auto& members : {even, reversed}) {
      auto sub = comm.new_group(members);
      const bool member = std::find(members.begin(), members.end(), c.rank) != members.end();
      report(c, (sub != nullptr) == member, "new_group: membership of rank " + std::to_string(c.rank));
      if (!sub) continue;
      report(c, sub->world_size() == static_cast<int>(members.size()), "new_group: world_size");
      for (const auto& op : ops) {
        std::string detail;
        const bool ok = run_checked(c, *sub, members, op, torch::kFloat, ReduceOp::Sum, 1000, 0, &detail);
        report(c, ok, "sub-group " + op + " of " + std::to_string(members.size()) + " ranks: " + detail);
      }
      sub->barrier()->wait();
    }
  }
  // Precondition errors are raised locally and identically on every rank, so no rank is left
  // inside a collective.
  {
    auto t = torch::ones({4, 4}, g_device);
    auto nc = t.t();
    expect_error(c, "non-contiguous all_reduce", "contiguous", [&] { comm.all_reduce(nc)->wait(); });
    auto i16 = torch::ones({4}, torch::TensorOptions(torch::kShort).device(g_device));
    expect_error(c, "int16 all_reduce", "dtype", [&] { comm.all_reduce(i16)->wait(); });
    auto in = torch::ones({n * 4 + 1}, g_device);
    auto out = torch::empty({4}, g_device);
    expect_error(c, "reduce_scatter size mismatch", "element",
                 [&] { comm.reduce_scatter(in, out)->wait(); });
    auto g_in = torch::ones({3}, g_device);
    auto g_out = torch::empty({3 * n + 2}, g_device);
    expect_error(c, "all_gather size mismatch", "element",
                 [&] { comm.all_gather(g_in, g_out)->wait(); });
    auto a_in = torch::ones({5, 2}, g_device);
    auto a_out = torch::empty({5, 2}, g_device);
    v1::AllToAllOptions ao;
    ao.input_split_sizes.assign(static_cast<size_t>(n), 0);
    ao.input_split_sizes[0] = 4;  // 4 of 5 rows
    expect_error(c, "all_to_all splits not adding up", "add up to 4 rows",
                 [&] { v1::all_to_all(comm, a_in, a_out, ao); });
    auto b = torch::ones({3}, g_device);
    v1::BroadcastOptions bo;
    bo.root = n;
    expect_error(c, "broadcast root out of range", "root", [&] { comm.broadcast(b, bo)->wait(); });
  }
  comm.barrier()->wait();
  // Everyone learns the total so each rank's exit code reflects all ranks.
  auto f = torch::tensor({static_cast<double>(c.failures)}, torch::kDouble).to(g_device);
  comm.all_reduce(f)->wait();
  const int total = static_cast<int>(f.item<double>());
  if (c.rank == 0)
    std::cout << "verify " << comm.backend() << ": world_size " << n << ", " << c.checks
              << " checks per rank, " << total << " failure(s) over all ranks" << std::endl;
  return total == 0 ? 0 : 1;
}

// Seconds of one call of `once` over --iters after --warmup untimed calls, started together
// after a barrier. --stat mean (nccl-tests): the loop's time / iters, maximum over ranks.
// --stat median|min: each iteration timed on its own, its maximum over ranks, then the median or
// the minimum of those. On a shared VM the hypervisor steals the CPU in bursts that land in some
// iterations and not others; the mean carries them, the median of short iterations mostly not.
double time_per_iteration(Ctx& c, const std::function<void()>& once) {
  auto& comm = *c.comm;
  using clock = std::chrono::steady_clock;
  const int iters = std::max(1, c.args.iters);
  for (int i = 0; i < c.args.warmup; ++i) once();
  comm.barrier()->wait();
  const bool each = c.args.stat != "mean";
  std::vector<double> per(each ? iters : 1);
  const auto t0 = clock::now();
  auto last = t0;
  for (int i = 0; i < iters; ++i) {
    once();
    if (each) {
      // Work::wait() on a device only orders the compute stream: the host waits for it here.
      if (g_device.is_cuda()) torch::cuda::synchronize(g_device.index());
      const auto t = clock::now();
      per[i] = std::chrono::duration<double>(t - last).count();
      last = t;
    }
  }
  if (!each) {
    if (g_device.is_cuda()) torch::cuda::synchronize(g_device.index());
    per[0] = std::chrono::duration<double>(clock::now() - t0).count() / iters;
  }
  auto tt = torch::tensor(per, torch::kDouble).to(g_device);
  v1::AllReduceOptions mx;
  mx.op = ReduceOp::Max;
  comm.all_reduce(tt, mx)->wait();
  tt = tt.cpu();
  std::vector<double> worst(tt.data_ptr<double>(), tt.data_ptr<double>() + tt.numel());
  std::sort(worst.begin(), worst.end());
  if (c.args.stat == "min") return worst.front();
  const size_t m = worst.size() / 2;
  return worst.size() % 2 ? worst[m] : 0.5 * (worst[m - 1] + worst[m]);
}

double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "reducescatter" || op == "allgather" || op == "alltoall")
    return static_cast<double>(n - 1) / n;
  return 1.0;
}

int bench(Ctx& c) {
  auto& comm = *c.comm;
  const int n = c.world;
  const auto ops = expand(c.args.op, kOps, "--op");
  const auto dt_name = c.args.dtype;
  const auto dtype = dtype_of(dt_name);
  const auto rop = reduce_of(c.args.reduce);
  const int64_t esize = c10::elementSize(dtype);
  std::vector<int> members(n);
  for (int r = 0; r < n; ++r) members[r] = r;
  const auto sizes = c.args.counts.empty() ? parse_sizes(c.args.sizes) : std::vector<int64_t>{};
  std::vector<int64_t> counts = c.args.counts.empty() ? std::vector<int64_t>{} : parse_counts(c.args.counts);
  if (counts.empty())
    for (int64_t s : sizes) counts.push_back(std::max<int64_t>(1, s / esize));
  for (const auto& op : ops) {
    if (c.rank == 0) {
      std::cout << "# " << op << (op == "allreduce" && c.args.algo == "ring" ? " (ring over send/recv, chunks of " + c.args.chunk + ")" : "")
                << " on " << comm.backend() << ", " << n << " ranks, " << dt_name
                << (op == "allreduce" || op == "reducescatter" ? ", " + c.args.reduce : "")
                << ", " << c.args.iters << " iterations after " << c.args.warmup << " warm-up"
                << (c.args.stat == "mean" ? "" : ", " + c.args.stat + " iteration")
                << (c.args.label.empty() ? "" : " [" + c.args.label + "]") << "\n"
                << std::right << std::setw(12) << "size(B)" << std::setw(12) << "count"
                << std::setw(10) << "type" << std::setw(12) << "time(us)" << std::setw(12)
                << "algbw(GB/s)" << std::setw(12) << "busbw(GB/s)" << "  check" << std::endl;
    }
    for (int64_t count0 : counts) {
      // Reduce-scatter and all-gather move a world-sized buffer: size is that buffer, the
      // per-rank chunk is size / n (as nccl-tests counts them).
      const bool chunked = op == "reducescatter" || op == "allgather" || op == "alltoall";
      const int64_t chunk = chunked ? std::max<int64_t>(1, count0 / n) : count0;
      const int64_t total = chunked ? chunk * n : chunk;
      std::string check = "skipped";
      if (c.args.check) {
        std::string detail;
        const bool ok = run_checked(c, comm, members, op, dtype, rop, chunk, 0, &detail);
        report(c, ok, label(op, dt_name, c.args.reduce, chunk) + ": " + detail);
        check = ok ? "ok" : "FAIL " + detail;
      }
      const bool whole_in = op == "reducescatter" || op == "alltoall";
      auto x = input_of(c.rank, chunked && whole_in ? total : chunk, dtype);
      auto y = torch::empty({op == "allgather" || op == "alltoall" ? total : chunk}, x.options());
      auto once = [&] {
        if (op == "allreduce") {
          all_reduce_with(c, comm, x, rop);
        } else if (op == "reducescatter") {
          v1::ReduceScatterOptions o;
          o.op = rop;
          comm.reduce_scatter(x, y, o)->wait();
        } else if (op == "allgather") {
          comm.all_gather(x, y)->wait();
        } else if (op == "alltoall") {
          v1::all_to_all(comm, x, y);
        } else {
          comm.broadcast(x)->wait();
        }
      };
      const double dt = time_per_iteration(c, once);
      const double bytes = static_cast<double>(total * esize);
      const double algbw = bytes / dt / 1e9;
      if (c.rank == 0)
        std::cout << std::right << std::setw(12) << static_cast<int64_t>(bytes) << std::setw(12)
                  << total << std::setw(10) << dt_name << std::setw(12) << std::fixed
                  << std::setprecision(1) << dt * 1e6 << std::setw(12) << std::setprecision(3)
                  << algbw << std::setw(12) << algbw * bus_factor(op, n) << std::defaultfloat
                  << "  " << check << std::endl;
    }
  }
  auto f = torch::tensor({static_cast<double>(c.failures)}, torch::kDouble).to(g_device);
  comm.all_reduce(f)->wait();
  return f.item<double>() == 0 ? 0 : 1;
}

// Tensor fusion (Horovod): --fusion K tensors of --sizes bytes each, all-reduced one by one vs
// copied into one buffer, all-reduced once and copied back, timed the same way as bench().
int fusion_bench(Ctx& c) {
  auto& comm = *c.comm;
  const auto dtype = dtype_of(c.args.dtype);
  const auto rop = reduce_of(c.args.reduce);
  const auto sizes = parse_sizes(c.args.sizes);
  const int k = c.args.fusion;
  for (int64_t bytes : sizes) {
    const int64_t count = std::max<int64_t>(1, bytes / c10::elementSize(dtype));
    std::vector<torch::Tensor> ts;
    for (int i = 0; i < k; ++i) ts.push_back(input_of(c.rank, count, dtype, i * count));
    torch::Tensor fused = torch::empty({count * k}, ts[0].options());
    auto one_by_one = [&] {
      for (auto& t : ts) all_reduce_with(c, comm, t, rop);
    };
    auto fused_once = [&] {
      for (int i = 0; i < k; ++i) fused.slice(0, i * count, (i + 1) * count).copy_(ts[i]);
      all_reduce_with(c, comm, fused, rop);
      for (int i = 0; i < k; ++i) ts[i].copy_(fused.slice(0, i * count, (i + 1) * count));
    };
    // Correctness of the fused path first: same result as the reference.
    for (int i = 0; i < k; ++i) ts[i] = input_of(c.rank, count, dtype, i * count);
    fused_once();
    std::vector<int> members(c.world);
    for (int r = 0; r < c.world; ++r) members[r] = r;
    double worst = 0;
    for (int i = 0; i < k; ++i) {
      const double e = mismatch(ts[i], reduce_reference(members, count, i * count, rop, dtype));
      worst = std::max(worst, e);
    }
    report(c, worst < 0 || worst == 0, "fused all-reduce differs from the reference");
    const double separate = time_per_iteration(c, one_by_one);
    const double together = time_per_iteration(c, fused_once);
    if (c.rank == 0)
      std::cout << "# fusion: " << k << " tensors x " << bytes << " B, " << c.args.dtype << ", "
                << comm.backend() << " " << c.world << " ranks, algo " << c.args.algo << "\n"
                << "one by one " << std::fixed << std::setprecision(1) << separate * 1e6
                << " us, fused " << together * 1e6 << " us (copies included), ratio "
                << std::setprecision(2) << separate / together << "x" << std::defaultfloat
                << std::endl;
  }
  auto f = torch::tensor({static_cast<double>(c.failures)}, torch::kDouble).to(g_device);
  comm.all_reduce(f)->wait();
  return f.item<double>() == 0 ? 0 : 1;
}

// Faults for the tests: make this rank misbehave at a given point.
//   mismatch:R   rank R all-reduces 11 elements where the others all-reduce 10
//   mismatch_kind:R  rank R broadcasts 10 elements where the others all-reduce them (on
//                gloo-cpu within one machine: two transports, TCP and shared memory)
//   stall:R:S    rank R sleeps S seconds before its first collective
//   skip:R       rank R issues no collective at all and exits 0 (the others time out)
void inject(Ctx& c) {
  if (c.args.inject.empty()) return;
  std::vector<std::string> f;
  std::stringstream ss(c.args.inject);
  for (std::string item; std::getline(ss, item, ':');) f.push_back(item);
  const int who = f.size() > 1 ? std::atoi(f[1].c_str()) : 0;
  if (f[0] == "mismatch") {
    auto t = torch::ones({c.rank == who ? 11 : 10});
    c.comm->all_reduce(t)->wait();
  } else if (f[0] == "mismatch_kind") {
    auto t = torch::ones({10});
    if (c.rank == who) {
      v1::BroadcastOptions o;
      o.root = 0;
      c.comm->broadcast(t, o)->wait();
    } else {
      c.comm->all_reduce(t)->wait();
    }
  } else if (f[0] == "stall") {
    if (c.rank == who)
      std::this_thread::sleep_for(std::chrono::duration<double>(f.size() > 2 ? std::atof(f[2].c_str()) : 5.0));
    auto t = torch::ones({10});
    c.comm->all_reduce(t)->wait();
  } else if (f[0] == "skip") {
    if (c.rank == who) std::exit(0);
    auto t = torch::ones({10});
    c.comm->all_reduce(t)->wait();
  } else {
    throw v1::ConfigError("--inject " + c.args.inject + ": expected mismatch:R, mismatch_kind:R, stall:R:S or skip:R");
  }
}

// The flags whose values their types do not check; false after printing what is wrong.
bool check_args(const Args& a) {
  if (a.algo == "ring") {
    int64_t chunk = 0;
    try {
      chunk = core::parse_size(a.chunk);
    } catch (const std::exception& e) {
      std::cerr << "trainrun bench: error: --chunk " << a.chunk << ": " << e.what() << std::endl;
      return false;
    }
    if (chunk < 1024) {
      std::cerr << "trainrun bench: error: --chunk " << a.chunk
                << ": the ring's chunk must be at least 1K (as the strategy's chunk_kb >= 1)"
                << std::endl;
      return false;
    }
  }
  if (a.stat != "mean" && a.stat != "median" && a.stat != "min") {
    std::cerr << "trainrun bench: error: --stat " << a.stat << ": expected mean, median or min"
              << std::endl;
    return false;
  }
  return true;
}

}  // namespace

int run_bench_command(int argc, char** argv) {
  Args a;
  po::options_description opts("trainrun bench collectives options");
  opts.add_options()("help,h", "show this help")(
      "backend", po::value(&a.backend)->default_value(a.backend),
      "accelerator plugin: gloo-cpu, mpi, cpu, cuda (NCCL, or Gloo via host memory with --set "
      "accelerator.collectives=gloo), ...")(
      "nproc", po::value(&a.nproc)->default_value(a.nproc),
      "ranks to launch on this machine (ignored under a launcher)")(
      "op", po::value(&a.op)->default_value(a.op),
      "allreduce|reducescatter|allgather|broadcast|alltoall, a comma list, or all")(
      "dtype", po::value(&a.dtype)->default_value(a.dtype),
      "float32|float64|bfloat16|float16|int32|int64|uint8 (--verify: list or all)")(
      "reduce", po::value(&a.reduce)->default_value(a.reduce),
      "sum|avg|min|max (--verify: list or all)")(
      "sizes", po::value(&a.sizes)->default_value(a.sizes),
      "bytes: FIRST:LAST doubling, or a comma list (1K, 4MiB, ...)")(
      "counts", po::value(&a.counts), "element counts instead of --sizes, e.g. 0,1,7,1000003")(
      "iters", po::value(&a.iters)->default_value(a.iters), "timed iterations per size")(
      "warmup", po::value(&a.warmup)->default_value(a.warmup), "untimed iterations per size")(
      "stat", po::value(&a.stat)->default_value(a.stat),
      "time column: mean (nccl-tests: loop time / iters), or median|min of the iterations timed "
      "one by one (steadier on a shared VM)")("check", po::value(&a.check)->default_value(a.check),
                                              "check each row's result against a local reference")(
      "verify", po::bool_switch(&a.verify),
      "run the correctness matrix instead of timing (exit 1 on any failure)")(
      "inject", po::value(&a.inject),
      "fault injection for tests: mismatch:R, mismatch_kind:R, stall:R:S, skip:R")(
      "label", po::value(&a.label),
      "free text printed in the table header (e.g. to tell runs apart)")(
      "algo", po::value(&a.algo)->default_value(a.algo),
      "all-reduce algorithm: native (the backend's own) or ring (the SDK's ring over send/recv, as "
      "the ring strategy)")("chunk", po::value(&a.chunk)->default_value(a.chunk),
                            "--algo ring: pipelining chunk size")(
      "fusion", po::value(&a.fusion)->default_value(a.fusion),
      "time K tensors of each --sizes all-reduced one by one vs fused into one buffer (0 = off)")(
      "set", po::value(&a.sets)->composing(), "accelerator option: --set accelerator.timeout_s=10")(
      "plugin-path", po::value(&a.plugin_paths)->composing(),
      "plugin directory or file, searched first");
  po::options_description hidden;
  std::vector<std::string> positional;
  hidden.add_options()("positional", po::value(&positional));
  po::positional_options_description pos;
  pos.add("positional", -1);
  po::variables_map vm;
  if (!store_command_line(argc, argv, "trainrun bench", opts, hidden, pos, vm)) return 2;
  if (!check_args(a)) return 2;
  // The matrix covers everything unless narrowed explicitly.
  if (a.verify) {
    if (vm["op"].defaulted()) a.op = "all";
    if (vm["dtype"].defaulted()) a.dtype = "all";
    if (vm["reduce"].defaulted()) a.reduce = "all";
  }
  // positional = {"bench", "collectives"}
  if (vm.count("help") || positional.size() < 2 || positional[1] != "collectives") {
    std::cout << "usage: trainrun bench collectives --backend gloo-cpu|mpi|cuda --nproc N "
                 "[--op allreduce] [--sizes 4K:256M] [--iters 20] [--warmup 5] [--verify] "
                 "[--algo native|ring] [--chunk 4M] [--fusion K] [--set accelerator.KEY=VALUE]\n\n"
              << opts << std::endl;
    return vm.count("help") ? 0 : 2;
  }
  try {
    const core::WorkerEnvironment env = core::detect_worker_environment();
    if (!env.is_worker && a.nproc > 1) {
      core::LaunchSpec spec;
      spec.nproc_per_node = a.nproc;
      spec.mpiexec = a.backend == "mpi";
      spec.grace_s = 3;
      spec.rendezvous_timeout_s = 60;
      spec.argv.push_back(core::self_executable());
      for (int i = 1; i < argc; ++i) spec.argv.push_back(argv[i]);
      return core::launch(spec);
    }
    Registry reg;
    reg.load_search_path(Registry::search_path(a.plugin_paths, {}));
    const core::ComponentInfo& info =
        reg.require(v1::ComponentKind::Accelerator, a.backend, "--backend");
    v1::RunContext ctx;
    ctx.rank = env.rank;
    ctx.world_size = env.world_size;
    ctx.local_rank = env.local_rank;
    ctx.local_world_size = env.local_world_size;
    auto acc = core::guarded(core::describe_component(info), "create", [&] {
      return reg.create<v1::Accelerator>(info, accelerator_options(info, a.sets), ctx);
    });
    g_device = acc->device();
    Ctx c{&acc->communicator(), ctx.rank, ctx.world_size, a};
    if (c.comm->world_size() != ctx.world_size)
      throw v1::Error("backend " + a.backend + " reports world_size " +
                      std::to_string(c.comm->world_size()) + ", the environment says " +
                      std::to_string(ctx.world_size));
    if (c.rank == 0)
      std::cout << "# " << acc->describe() << std::endl;
    inject(c);
    if (a.algo != "native" && a.algo != "ring")
      throw v1::ConfigError("--algo " + a.algo + ": expected native or ring");
    if (a.fusion > 0) return fusion_bench(c);
    if (a.verify) {
      const auto counts = parse_counts(a.counts.empty() ? "0,1,7,1000003" : a.counts);
      return verify(c, counts);
    }
    return bench(c);
  } catch (...) {
    return report_failure("trainrun bench");
  }
}

}  // namespace trainrun::app
