// The cuda plugin's logic that needs no GPU: the NCCL communicator's bookkeeping of operations
// in flight (driven by scripted completion events), device selection, the NCCL type and
// reduction mapping, and the error when no device is visible.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <trainrun/error.hpp>

#include "cuda.hpp"
#include "nccl.hpp"
#include "pending.hpp"

using namespace trainrun::plugins::cuda;
using Clock = std::chrono::steady_clock;

namespace {

// An event whose completion the test sets.
struct ScriptedEvent : CompletionProbe {
  bool finished = false;
  int queries = 0;
  bool done() override {
    ++queries;
    return finished;
  }
};

PendingOp op(uint64_t seq, const std::shared_ptr<ScriptedEvent>& e, Clock::time_point deadline,
             std::shared_ptr<int> alive = nullptr) {
  PendingOp p;
  p.seq = seq;
  p.text = "op " + std::to_string(seq);
  p.deadline = deadline;
  p.end = e;
  p.keep_alive = alive;
  return p;
}

std::string fails_with(const std::vector<int64_t>& ids, int local_rank, int local_world,
                       int devices) {
  std::string message;
  const int d = select_device(ids, local_rank, local_world, devices,
                              [&](const std::string& m) { message = m; });
  return message.empty() ? "device " + std::to_string(d) : message;
}

}  // namespace

TEST_SUITE("cuda_pending") {
  TEST_CASE("finished ops retire in stream order; a later finished op waits for an earlier one") {
    PendingOps q;
    const auto now = Clock::now(), later = now + std::chrono::seconds(60);
    auto a = std::make_shared<ScriptedEvent>(), b = std::make_shared<ScriptedEvent>(),
         c = std::make_shared<ScriptedEvent>();
    q.add(op(1, a, later));
    q.add(op(2, b, later));
    q.add(op(3, c, later));
    b->finished = true;  // out of order: must not be retired before 1
    PollResult r = q.poll(now);
    CHECK(r.finished.empty());
    CHECK_FALSE(r.expired);
    CHECK(q.size() == 3);
    CHECK(b->queries == 0);  // nothing behind an unfinished op is even queried
    a->finished = true;
    r = q.poll(now);
    CHECK(r.finished == std::vector<uint64_t>{1, 2});
    CHECK(q.size() == 1);
    c->finished = true;
    r = q.poll(now);
    CHECK(r.finished == std::vector<uint64_t>{3});
    CHECK(q.size() == 0);
  }

  TEST_CASE("the oldest unfinished op past its deadline is reported; later ones are not") {
    PendingOps q;
    const auto t0 = Clock::now();
    auto a = std::make_shared<ScriptedEvent>(), b = std::make_shared<ScriptedEvent>();
    q.add(op(7, a, t0 + std::chrono::seconds(10)));
    q.add(op(8, b, t0 + std::chrono::seconds(1)));  // earlier deadline, but behind op 7
    CHECK_FALSE(q.poll(t0 + std::chrono::seconds(5)).expired);
    PollResult r = q.poll(t0 + std::chrono::seconds(11));
    REQUIRE(r.expired);
    CHECK(r.expired->seq == 7);
    CHECK(r.expired->text == "op 7");
    a->finished = true;
    r = q.poll(t0 + std::chrono::seconds(11));
    CHECK(r.finished == std::vector<uint64_t>{7});
    REQUIRE(r.expired);
    CHECK(r.expired->seq == 8);
  }

  TEST_CASE("send/recv (seq 0) retire without a sequence number; tensors live until retired") {
    PendingOps q;
    const auto now = Clock::now(), later = now + std::chrono::seconds(60);
    auto a = std::make_shared<ScriptedEvent>(), b = std::make_shared<ScriptedEvent>();
    auto tensors = std::make_shared<int>(42);
    std::weak_ptr<int> watch = tensors;
    q.add(op(0, a, later, tensors));
    q.add(op(4, b, later));
    tensors.reset();
    CHECK_FALSE(watch.expired());  // held by the pending op
    a->finished = b->finished = true;
    PollResult r = q.poll(now);
    CHECK(r.finished == std::vector<uint64_t>{4});
    CHECK(watch.expired());
  }

  TEST_CASE("clear() drops everything (after an abort)") {
    PendingOps q;
    auto a = std::make_shared<ScriptedEvent>();
    q.add(op(1, a, Clock::now()));
    CHECK(q.clear().size() == 1);
    CHECK(q.size() == 0);
    CHECK_FALSE(q.poll(Clock::now() + std::chrono::hours(1)).expired);
  }
}

TEST_SUITE("cuda_options") {
  TEST_CASE("device selection: local rank by default, device_ids when given") {
    CHECK(fails_with({}, 0, 1, 1) == "device 0");
    CHECK(fails_with({}, 1, 2, 2) == "device 1");
    CHECK(fails_with({3, 2}, 1, 2, 4) == "device 2");
    CHECK(fails_with({0, 0}, 1, 2, 1) == "device 0");  // shared (gloo only; checked elsewhere)
  }
  TEST_CASE("device selection errors name the rank, the id and the visible count") {
    CHECK(fails_with({}, 1, 2, 1).find("local rank 1 has no CUDA device of its own (1 visible)") !=
          std::string::npos);
    CHECK(fails_with({0, 5}, 1, 2, 2).find("device_ids[1] = 5 is not a visible CUDA device (2 "
                                           "visible: 0..1)") != std::string::npos);
    CHECK(fails_with({0}, 0, 2, 2).find("device_ids lists 1 device(s) but 2 ranks") !=
          std::string::npos);
  }
  TEST_CASE("NCCL's refusal of two ranks on one device is found before NCCL is started") {
    CHECK(shared_device({0, 1, 0}, 3) == "device 0 for local ranks 0 and 2");
    CHECK(shared_device({0, 1, 0}, 2).empty());  // the third id belongs to no local rank
    CHECK(shared_device({}, 4).empty());
  }
  TEST_CASE("dtypes and reductions map onto NCCL's") {
    CHECK(nccl_dtype(c10::ScalarType::Float) == ncclFloat32);
    CHECK(nccl_dtype(c10::ScalarType::BFloat16) == ncclBfloat16);
    CHECK(nccl_dtype(c10::ScalarType::Half) == ncclFloat16);
    CHECK(nccl_dtype(c10::ScalarType::Long) == ncclInt64);
    CHECK(nccl_dtype(c10::ScalarType::Byte) == ncclUint8);
    CHECK_THROWS_WITH(nccl_dtype(c10::ScalarType::ComplexFloat),
                      doctest::Contains("has no NCCL type"));
    CHECK(nccl_reduce_op(trainrun::v1::ReduceOp::Avg) == ncclAvg);
    CHECK(nccl_reduce_op(trainrun::v1::ReduceOp::Max) == ncclMax);
    CHECK(NcclCommunicator::nccl_version() ==
          std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." +
              std::to_string(NCCL_PATCH));
  }
}

// Only where no GPU is visible (tests/gpus.cmake skips it where /dev/nvidia0 exists).
TEST_SUITE("cuda_no_device") {
  TEST_CASE("no device: ConfigError naming the cause and carrying the CUDA runtime's error") {
    try {
      visible_devices("[accelerator] (job.toml)");
      FAIL("visible_devices returned on a machine without a GPU");
    } catch (const trainrun::v1::ConfigError& e) {
      const std::string m = e.what();
      CHECK(m.find("[accelerator] (job.toml): accelerator 'cuda': no CUDA device visible") == 0);
      CHECK(m.find("(cudaGetDeviceCount: cuda") != std::string::npos);  // cudaError... name
    }
  }
}

// The Gloo-via-host wrapper with a recording inner communicator. CPU tensors pass through
// unstaged (the device copies need a GPU: scripts/device-check part a runs them).
namespace {
struct Recorder final : trainrun::v1::Communicator {
  std::vector<std::string> calls;
  int rank() const override { return 1; }
  int world_size() const override { return 2; }
  std::string backend() const override { return "fake"; }
  std::shared_ptr<trainrun::v1::Work> all_reduce(at::Tensor& t,
                                                 const trainrun::v1::AllReduceOptions&) override {
    calls.push_back("all_reduce");
    t.mul_(2);
    return std::make_shared<trainrun::v1::CompletedWork>();
  }
  std::shared_ptr<trainrun::v1::Work> reduce_scatter(
      const at::Tensor& in, at::Tensor& out, const trainrun::v1::ReduceScatterOptions&) override {
    calls.push_back("reduce_scatter");
    out.copy_(in.view({2, -1}).sum(0));
    return std::make_shared<trainrun::v1::CompletedWork>();
  }
  std::shared_ptr<trainrun::v1::Work> barrier(const trainrun::v1::BarrierOptions&) override {
    calls.push_back("barrier");
    return std::make_shared<trainrun::v1::CompletedWork>();
  }
  std::shared_ptr<trainrun::v1::Communicator> new_group(const std::vector<int>&) override {
    calls.push_back("new_group");
    return nullptr;
  }
};
}  // namespace

TEST_SUITE("cuda_options") {
  TEST_CASE("host staging forwards each op to the inner communicator and returns its result") {
    auto inner = std::make_shared<Recorder>();
    HostStagingCommunicator s(inner, *inner);
    CHECK(s.backend() == "fake via host");
    CHECK(s.rank() == 1);
    CHECK(s.world_size() == 2);
    at::Tensor t = at::ones({3});
    auto w = s.all_reduce(t);
    CHECK(w->completed());
    CHECK(t.sum().item<float>() == 6.0f);
    at::Tensor in = at::arange(4, at::TensorOptions().dtype(at::kFloat)), out = at::empty({2});
    s.reduce_scatter(in, out)->wait();
    CHECK(out[0].item<float>() == 2.0f);  // 0 + 2
    CHECK(out[1].item<float>() == 4.0f);  // 1 + 3
    s.barrier()->wait();
    CHECK(s.new_group({0}) == nullptr);  // a non-member stays a non-member
    CHECK(inner->calls == std::vector<std::string>{"all_reduce", "reduce_scatter", "barrier", "new_group"});
    at::Tensor b = at::ones({2});
    CHECK_THROWS_WITH(s.broadcast(b), doctest::Contains("fake communicator does not support broadcast"));
  }
}
