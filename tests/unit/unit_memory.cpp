// The CPU memory tracker (core/src/memory.cpp, read through the SDK's trainrun/runtime/memory.hpp
// as a plugin reads it) and the ZeRO memory estimator (sdk trainrun/strategy/memory_estimate.hpp).
//   unit_memory [doctest options]     the tests; the tracker is installed before they run
//   unit_memory --bench-alloc [N]     N x (at::empty({16}) + free) without, then with the tracker
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include <trainrun/runtime/memory.hpp>
#include <trainrun/strategy/memory_estimate.hpp>

#include "trainrun/core/memory.hpp"
#include "trainrun/core/registry.hpp"

using namespace trainrun;
namespace mem = trainrun::v1::memory;

namespace {

constexpr int64_t kMiB = 1 << 20;

v1::Options defaults_of(const core::ComponentInfo& info, std::map<std::string, v1::OptionValue> set = {}) {
  std::map<std::string, v1::OptionValue> v;
  for (const auto& s : info.schema.specs()) v[s.name] = s.default_value;
  for (auto& [k, x] : set) v[k] = x;
  return v1::Options(v, "[test] " + info.name);
}

}  // namespace

TEST_SUITE("memory_tracker") {
  TEST_CASE("a 1 MiB tensor raises current bytes by at least 1 MiB; freeing it lowers them") {
    REQUIRE(mem::tracking());  // found through dlsym, as a plugin finds it
    const int64_t before = mem::cpu_stats().current_bytes;
    CHECK(before >= 0);
    CHECK(before == core::tracked_current_bytes());
    {
      at::Tensor t = at::empty({kMiB / 4}, at::kFloat);
      const v1::MemoryStats s = mem::cpu_stats();
      CHECK(s.current_bytes - before >= kMiB);
      CHECK(s.current_bytes - before < kMiB + 4096);
      CHECK(s.peak_bytes >= s.current_bytes);
      CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64 == 0);  // c10's alignment kept
    }
    CHECK(mem::cpu_stats().current_bytes == before);
    CHECK(mem::cpu_stats().total_bytes == mem::physical_memory_bytes());
    CHECK(mem::physical_memory_bytes() > (int64_t{1} << 28));
  }

  TEST_CASE("peak follows the largest moment since reset_peak") {
    mem::reset_peak();
    const int64_t base = mem::cpu_stats().current_bytes;
    CHECK(mem::cpu_stats().peak_bytes == base);
    {
      at::Tensor a = at::empty({2 * kMiB}, at::kByte);
      { at::Tensor b = at::empty({3 * kMiB}, at::kByte); }
      const v1::MemoryStats s = mem::cpu_stats();
      CHECK(s.current_bytes - base >= 2 * kMiB);
      CHECK(s.current_bytes - base < 2 * kMiB + 4096);
      CHECK(s.peak_bytes - base >= 5 * kMiB);  // a and b were alive together
      mem::reset_peak();
      CHECK(mem::cpu_stats().peak_bytes == mem::cpu_stats().current_bytes);
    }
    CHECK(mem::cpu_stats().current_bytes == base);
    CHECK(mem::cpu_stats().peak_bytes >= base + 2 * kMiB);  // reset left the peak at a's moment
  }

  TEST_CASE("raw_allocate/raw_deallocate, resize and empty tensors are counted consistently") {
    c10::Allocator* a = c10::GetAllocator(c10::DeviceType::CPU);
    const int64_t base = core::tracked_current_bytes();
    void* p = a->raw_allocate(1000);  // oneDNN (ideep) allocates this way
    CHECK(core::tracked_current_bytes() == base + 1000);
    std::memset(p, 1, 1000);
    a->raw_deallocate(p);
    CHECK(core::tracked_current_bytes() == base);
    {
      at::Tensor e = at::empty({0});
      CHECK(core::tracked_current_bytes() == base);
      e.resize_({1000});  // resizing a storage allocates through the same allocator
      CHECK(core::tracked_current_bytes() == base + 4000);
    }
    CHECK(core::tracked_current_bytes() == base);
  }

  TEST_CASE("a plugin library (loaded RTLD_LOCAL) reports the same bytes") {
    core::Registry reg;
    reg.load_search_path({TRAINRUN_TEST_PLUGIN_DIR});
    const core::ComponentInfo* cpu = reg.find(v1::ComponentKind::Accelerator, "cpu");
    REQUIRE(cpu != nullptr);
    v1::RunContext ctx;
    auto acc = reg.create<v1::Accelerator>(*cpu, defaults_of(*cpu, {{"threads", int64_t{1}}}), ctx);
    at::Tensor t = at::empty({kMiB}, at::kByte);
    const v1::MemoryStats s = acc->memory_stats();
    CHECK(s.current_bytes == core::tracked_current_bytes());
    CHECK(s.peak_bytes == core::tracked_peak_bytes());
    CHECK(s.total_bytes == mem::physical_memory_bytes());
  }

  TEST_CASE("memory_inputs from the shipped precision and optimizers") {
    core::Registry reg;
    reg.load_search_path({TRAINRUN_TEST_PLUGIN_DIR});
    v1::RunContext ctx;
    auto make = [&](v1::ComponentKind kind, const char* name, std::map<std::string, v1::OptionValue> set = {}) {
      const core::ComponentInfo* info = reg.find(kind, name);
      REQUIRE(info != nullptr);
      return std::pair{info, defaults_of(*info, std::move(set))};
    };
    auto [fp32, fp32_opts] = make(v1::ComponentKind::Precision, "fp32");
    auto [adamw, adamw_opts] = make(v1::ComponentKind::Optimizer, "adamw");
    auto [sgd, sgd_opts] = make(v1::ComponentKind::Optimizer, "sgd", {{"lr", 0.1}, {"momentum", 0.9}});
    auto precision = reg.create<v1::Precision>(*fp32, fp32_opts, ctx);
    auto adam = reg.create<v1::Optimizer>(*adamw, adamw_opts, ctx);
    auto momentum = reg.create<v1::Optimizer>(*sgd, sgd_opts, ctx);
    auto plain = reg.create<v1::Optimizer>(*sgd, defaults_of(*sgd, {{"lr", 0.1}, {"momentum", 0.0}}), ctx);

    v1::MemoryInputs mi = core::memory_inputs(precision.get(), adam.get(), 64 * kMiB, 4, 8);
    CHECK(mi.param_bytes == 4);
    CHECK(mi.grad_bytes == 4);
    CHECK(mi.master_bytes == 0);
    CHECK(mi.optimizer_bytes == 8);
    CHECK(mi.memory_budget_bytes == 16 * kMiB);
    CHECK(mi.local_world_size == 4);
    CHECK(mi.nnodes == 2);
    CHECK(core::memory_inputs(precision.get(), momentum.get(), -1, 1, 1).optimizer_bytes == 4);
    CHECK(core::memory_inputs(precision.get(), plain.get(), -1, 1, 1).optimizer_bytes == 0);
    // Components that say nothing: fp32 assumed, optimizer unknown, no budget.
    mi = core::memory_inputs(nullptr, nullptr, -1, 2, 2);
    CHECK(mi.param_bytes == 4);
    CHECK(mi.optimizer_bytes == -1);
    CHECK(mi.memory_budget_bytes == -1);
    CHECK(mi.nnodes == 1);
  }
}

TEST_SUITE("memory_estimate") {
  TEST_CASE("the paper's example: 7.5B parameters, N = 64, mixed-precision Adam (K = 12)") {
    // Rajbhandari et al. SC20, Figure 1: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (GB = 1e9 bytes:
    // 16 x 7.5e9 is exactly 120e9).
    mem::ZeroEstimateInputs in;
    in.num_params = 7'500'000'000;
    in.world_size = 64;
    in.param_bytes = 2;
    in.grad_bytes = 2;
    in.master_bytes = 4;
    in.optimizer_bytes = 8;
    const auto e = mem::estimate_zero(in);
    CHECK(e[0].model_state_bytes == doctest::Approx(120e9));
    CHECK(e[1].model_state_bytes == doctest::Approx(31.40625e9));
    CHECK(e[2].model_state_bytes == doctest::Approx(16.640625e9));
    CHECK(e[3].model_state_bytes == doctest::Approx(1.875e9));
    const double printed[4] = {120, 31.4, 16.6, 1.9};
    for (int s = 0; s < 4; ++s) {
      CHECK(e[s].stage == s);
      CHECK(std::round(e[s].model_state_bytes / 1e8) / 10 == doctest::Approx(printed[s]));
      CHECK(e[s].buffers_bytes == 0);
      CHECK(e[s].total_bytes == e[s].model_state_bytes);
    }
    // Stage 1: 2 Psi + 2 Psi + K Psi / N, term by term.
    CHECK(e[1].params_bytes == doctest::Approx(15e9));
    CHECK(e[1].grads_bytes == doctest::Approx(15e9));
    CHECK(e[1].optimizer_bytes == doctest::Approx(12 * 7.5e9 / 64));
  }

  TEST_CASE("a small case by hand: Psi = 1000, N = 4, fp32 Adam (4 + 4 + 8)") {
    mem::ZeroEstimateInputs in;
    in.num_params = 1000;
    in.world_size = 4;
    auto e = mem::estimate_zero(in);
    // stage 0: 4000 + 4000 + 8000; 1: 4000 + 4000 + 2000; 2: 4000 + 1000 + 2000;
    // 3: 1000 + 1000 + 2000.
    CHECK(e[0].params_bytes == 4000);
    CHECK(e[0].grads_bytes == 4000);
    CHECK(e[0].optimizer_bytes == 8000);
    CHECK(e[0].model_state_bytes == 16000);
    CHECK(e[1].model_state_bytes == 10000);
    CHECK(e[2].grads_bytes == 1000);
    CHECK(e[2].model_state_bytes == 7000);
    CHECK(e[3].params_bytes == 1000);
    CHECK(e[3].model_state_bytes == 4000);

    // Buffers: a 100-element reduce bucket at stages 2 and 3 (fp32, then bf16 on the wire);
    // stage 3 holds the largest unit (300) gathered, and one more ahead when prefetching.
    in.reduce_bucket_elems = 100;
    in.largest_unit_params = 300;
    e = mem::estimate_zero(in);
    CHECK(e[0].buffers_bytes == 0);
    CHECK(e[1].buffers_bytes == 0);
    CHECK(e[2].buffers_bytes == 400);
    CHECK(e[3].buffers_bytes == 400 + 1200);
    CHECK(e[3].total_bytes == 4000 + 1600);
    in.bucket_elem_bytes = 2;
    in.prefetch_elems = 50;  // less than a unit: the next whole unit
    CHECK(mem::estimate_zero_stage(in, 3).buffers_bytes == 200 + 4 * 600);
    in.prefetch_elems = 500;  // more than a unit: the window
    CHECK(mem::estimate_zero_stage(in, 3).buffers_bytes == 200 + 4 * 800);
    in.prefetch_elems = 5000;  // never more than the whole model
    CHECK(mem::estimate_zero_stage(in, 3).buffers_bytes == 200 + 4 * 1000);
    in.reduce_bucket_elems = 500'000'000;  // a bucket never holds more than Psi gradients
    CHECK(mem::estimate_zero_stage(in, 2).buffers_bytes == 2 * 1000);
    // 200 persistent parameters stay whole at stage 3: 4 x (800 / 4 + 200).
    in.persistent_params = 200;
    CHECK(mem::estimate_zero_stage(in, 3).params_bytes == 1600);
    CHECK(mem::estimate_zero_stage(in, 3).grads_bytes == 1000);
    // Persistent parameters are never gathered: at most the other 800 are (prefetch 5000).
    CHECK(mem::estimate_zero_stage(in, 3).buffers_bytes == 2 * 1000 + 4 * 800);
    in.persistent_params = 1000;  // everything persistent: stage 3 keeps the weights whole
    CHECK(mem::estimate_zero_stage(in, 3).params_bytes == 4000);
    CHECK(mem::estimate_zero_stage(in, 3).buffers_bytes == 2 * 1000);
  }

  TEST_CASE("a quantized frozen base: stored bytes, and what stays whole at stage 3") {
    // 100 trained fp32 parameters (an adapter), 1000 frozen weights stored in 530 bytes (NF4
    // with double quantization), a 400-byte tied embedding outside every unit; N = 2.
    mem::ZeroEstimateInputs in;
    in.num_params = 100;
    in.world_size = 2;
    in.frozen_params = 1000;
    CHECK(mem::estimate_zero_stage(in, 0).params_bytes == 4 * 1100);  // unknown storage: fp32
    in.frozen_bytes = 530;
    in.whole_frozen_bytes = 400;
    auto e = mem::estimate_zero(in);
    CHECK(e[0].params_bytes == 400 + 530 + 400);
    CHECK(e[0].grads_bytes == 400);  // only the trained ones
    CHECK(e[0].optimizer_bytes == 800);
    // Stage 3 shards the adapter and the stored base, never the whole-kept embedding.
    CHECK(e[3].params_bytes == doctest::Approx((400 + 530) / 2.0 + 400));
    // A gathered weight costs the average stored bytes: (400 + 530) / 1100 per weight.
    in.largest_unit_params = 110;
    CHECK(mem::estimate_zero_stage(in, 3).buffers_bytes == doctest::Approx(110 * 930.0 / 1100));
    in.whole_frozen_bytes = -1;
    CHECK_THROWS_AS(mem::estimate_zero(in), v1::Error);
  }

  TEST_CASE("inputs from MemoryInputs, and bad input") {
    v1::MemoryInputs mi;
    mi.param_bytes = 2;
    mi.grad_bytes = 2;
    mi.master_bytes = 4;
    auto in = mem::zero_inputs(mi, 10, 2);
    CHECK(in.num_params == 10);
    CHECK(in.world_size == 2);
    CHECK(in.optimizer_bytes == 8);  // unknown optimizer: Adam assumed
    mi.optimizer_bytes = 4;
    CHECK(mem::zero_inputs(mi, 10, 2).optimizer_bytes == 4);
    CHECK_THROWS_AS(mem::estimate_zero_stage(in, 4), v1::Error);
    in.world_size = 0;
    CHECK_THROWS_AS(mem::estimate_zero(in), v1::Error);
    in.world_size = 1;
    in.num_params = -1;
    CHECK_THROWS_AS(mem::estimate_zero(in), v1::Error);
  }

  TEST_CASE("the table of trainrun check") {
    CHECK(mem::format_bytes(0) == "0 B");
    CHECK(mem::format_bytes(812) == "812 B");
    CHECK(mem::format_bytes(3.1 * kMiB) == "3.10 MiB");
    CHECK(mem::format_bytes(12.5 * kMiB) == "12.5 MiB");
    CHECK(mem::format_bytes(1.75 * 1024 * kMiB) == "1.75 GiB");
    CHECK(mem::format_bytes(120e9) == "112 GiB");
    mem::ZeroEstimateInputs in;
    in.num_params = 1'000'000;
    in.world_size = 4;
    const auto e = mem::estimate_zero(in);
    auto lines = mem::format_zero_table(e);
    REQUIRE(lines.size() == 5);
    CHECK(lines[0].rfind("stage", 0) == 0);
    CHECK(lines[1].rfind("0 (ddp)", 0) == 0);
    CHECK(lines[1].find("15.3 MiB") != std::string::npos);  // 16e6 bytes
    CHECK(lines[4].rfind("3 (os+g+p)", 0) == 0);
    CHECK(lines[4].find("3.81 MiB") != std::string::npos);  // 4e6 bytes
    lines = mem::format_zero_table(e, 8'000'000);
    CHECK(lines[0].find("fits") != std::string::npos);
    CHECK(lines[1].substr(lines[1].size() - 2) == "no");
    CHECK(lines[4].substr(lines[4].size() - 3) == "yes");
    // With one micro-batch's activations: a peak column, and the fit judged on it.
    lines = mem::format_zero_table(e, 8'000'000, 5e6);
    CHECK(lines[0].find("peak") != std::string::npos);
    CHECK(lines[4].find("8.58 MiB") != std::string::npos);  // 4e6 + 5e6 bytes
    CHECK(lines[4].substr(lines[4].size() - 2) == "no");
  }
}

namespace {

// ns per at::empty({16}) + free over n iterations.
double ns_per_alloc(int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    at::Tensor t = at::empty({16});
    (void)t;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s * 1e9 / static_cast<double>(n);
}

// Rounds alternate between LibTorch's allocator and the tracker (swapped in and out at the
// priority the tracker holds; each storage keeps its own deleter, so swapping is safe), so
// both see the same machine load and heap state; the best round of each is reported.
int bench_alloc(int64_t n) {
  c10::Allocator* plain = c10::GetAllocator(c10::DeviceType::CPU);
  core::install_memory_tracker();
  c10::Allocator* tracker = c10::GetAllocator(c10::DeviceType::CPU);
  double best[2] = {1e30, 1e30};
  for (int round = 0; round < 10; ++round) {
    for (int k = 0; k < 2; ++k) {
      c10::SetAllocator(c10::DeviceType::CPU, k ? tracker : plain, 255);
      ns_per_alloc(n / 20);  // warm-up
      best[k] = std::min(best[k], ns_per_alloc(n));
    }
  }
  std::printf("at::empty({16}) + free, best of 10 alternating rounds of %lld: untracked %.1f ns, "
              "tracked %.1f ns, overhead %+.1f ns (%+.1f%%)\n",
              static_cast<long long>(n), best[0], best[1], best[1] - best[0],
              100 * (best[1] - best[0]) / best[0]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--bench-alloc")
    return bench_alloc(argc >= 3 ? std::stoll(argv[2]) : 1'000'000);
  core::install_memory_tracker();
  doctest::Context context(argc, argv);
  return context.run();
}
