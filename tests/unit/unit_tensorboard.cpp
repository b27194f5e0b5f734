// Unit tests of the tensorboard plugin: CRC-32C against the RFC 3720 check values, the TFRecord
// framing, the protobuf bytes of each event kind against hand-encoded expectations (the wire
// format spelled out field by field), the tags of a step, and the callback's files and switches.
// The round trip through TensorBoard's own reader is tests/e2e/tensorboard_e2e.sh.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "callbacks/tensorboard/event_file.hpp"
#include "callbacks/tensorboard/tensorboard.hpp"
#include "test_options.hpp"

namespace fs = std::filesystem;
using namespace trainrun::v1;
using namespace trainrun::plugins;
namespace tb = trainrun::plugins::tensorboard;

namespace {

std::string bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

Options make_options(const std::map<std::string, OptionValue>& overrides = {}) {
  return trainrun::test::make_options<TensorBoardCallback>(overrides);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST_SUITE("tensorboard") {
  TEST_CASE("crc32c matches the RFC 3720 B.4 and iSCSI check values") {
    const std::string digits = "123456789";
    CHECK(tb::crc32c(digits.data(), digits.size()) == 0xE3069283u);
    CHECK(tb::crc32c("", 0) == 0u);
    std::string zeros(32, '\0'), ones(32, '\xff'), up, down;
    for (int i = 0; i < 32; ++i) up.push_back(static_cast<char>(i));
    for (int i = 31; i >= 0; --i) down.push_back(static_cast<char>(i));
    CHECK(tb::crc32c(zeros.data(), 32) == 0x8A9136AAu);
    CHECK(tb::crc32c(ones.data(), 32) == 0x62A8AB43u);
    CHECK(tb::crc32c(up.data(), 32) == 0x46DD794Eu);
    CHECK(tb::crc32c(down.data(), 32) == 0x113FDB5Cu);
    // Continuing from a partial CRC equals one pass.
    CHECK(tb::crc32c(digits.data() + 4, 5, tb::crc32c(digits.data(), 4)) == 0xE3069283u);
  }

  TEST_CASE("masked crc rotates right by 15 and adds the TFRecord delta") {
    const std::string digits = "123456789";
    // 0xE3069283 ror 15 = 0x2507C60D; + 0xa282ead8 = 0xC78AB0E5 (mod 2^32).
    CHECK(tb::masked_crc32c(digits.data(), digits.size()) == 0xC78AB0E5u);
  }

  TEST_CASE("a record is length, its masked crc, the data, the data's masked crc") {
    const std::string data = "hello, tensorboard";
    const std::string r = tb::frame_record(data);
    REQUIRE(r.size() == 8 + 4 + data.size() + 4);
    CHECK(r.substr(0, 8) == bytes({18, 0, 0, 0, 0, 0, 0, 0}));
    CHECK(le32(r, 8) == tb::masked_crc32c(r.data(), 8));
    CHECK(r.substr(12, data.size()) == data);
    CHECK(le32(r, 12 + data.size()) == tb::masked_crc32c(data.data(), data.size()));
    // Lengths above 255 use the next byte (little-endian).
    CHECK(tb::frame_record(std::string(300, 'x')).substr(0, 8) == bytes({0x2C, 1, 0, 0, 0, 0, 0, 0}));
  }

  TEST_CASE("file_version event bytes") {
    // Event{wall_time (1, fixed64) = 2.0, file_version (3, length-delimited) = "brain.Event:2"}
    CHECK(tb::file_version_event(2.0) ==
          bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x1A, 13}) + "brain.Event:2");
  }

  TEST_CASE("scalars event bytes") {
    // Event{wall_time = 1.5 (0x3FF8000000000000), step (2, varint) = 300 (AC 02),
    //       summary (5) = Summary{value (1) = Value{tag (1) = "a", simple_value (2, fixed32) = 1.0f},
    //                             value (1) = Value{tag = "bc", simple_value = -2.0f}}}
    const std::string v1 = bytes({0x0A, 1}) + "a" + bytes({0x15, 0, 0, 0x80, 0x3F});
    const std::string v2 = bytes({0x0A, 2}) + "bc" + bytes({0x15, 0, 0, 0, 0xC0});
    const std::string summary = bytes({0x0A, static_cast<int>(v1.size())}) + v1 +
                                bytes({0x0A, static_cast<int>(v2.size())}) + v2;
    const std::string expected = bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x10, 0xAC, 0x02,
                                        0x2A, static_cast<int>(summary.size())}) + summary;
    CHECK(tb::scalars_event(1.5, 300, {{"a", 1.0f}, {"bc", -2.0f}}) == expected);
    // proto3 leaves a zero step out.
    CHECK(tb::scalars_event(1.5, 0, {}) == bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF8, 0x3F, 0x2A, 0}));
  }

  TEST_CASE("text event bytes") {
    // Value{tag (1) = "job", tensor (8) = TensorProto{dtype (1) = 7 (DT_STRING),
    //       tensor_shape (2) = {} (a scalar), string_val (8) = "x"},
    //       metadata (9) = SummaryMetadata{plugin_data (1) = {plugin_name (1) = "text"},
    //                                      data_class (4) = 2 (DATA_CLASS_TENSOR)}}
    const std::string tensor = bytes({0x08, 7, 0x12, 0, 0x42, 1}) + "x";
    const std::string plugin_data = bytes({0x0A, 4}) + "text";
    const std::string metadata = bytes({0x0A, 6}) + plugin_data + bytes({0x20, 2});
    const std::string value = bytes({0x0A, 3}) + "job" + bytes({0x42, 7}) + tensor +
                              bytes({0x4A, 10}) + metadata;
    const std::string summary = bytes({0x0A, static_cast<int>(value.size())}) + value;
    const std::string expected = bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0x40, 0x10, 5, 0x2A,
                                        static_cast<int>(summary.size())}) + summary;
    CHECK(tb::text_event(2.0, 5, "job", "x") == expected);
  }

  TEST_CASE("a step's tags follow metrics.jsonl's keys") {
    StepMetrics m;
    m.step = 4, m.epoch = 1, m.loss = 0.5, m.lr = 0.1, m.grad_norm = 2, m.step_time_s = 0.25;
    m.elapsed_s = 3, m.samples_per_s = 100, m.tokens_per_s = 0;
    m.extra = {{"mem_peak_bytes", 1e6}, {"loss", 7}};
    std::map<std::string, float> got;
    for (const auto& s : tb::step_scalars(m, true, "")) got[s.tag] = s.value;
    const std::map<std::string, float> want = {
        {"train/epoch", 1},           {"train/loss", 0.5f},      {"train/lr", 0.1f},
        {"train/grad_norm", 2},       {"train/step_time_s", 0.25f}, {"train/elapsed_s", 3},
        {"train/samples_per_s", 100}, {"train/mem_peak_bytes", 1e6f}, {"train/extra.loss", 7}};
    CHECK(got == want);

    // all_ranks on rank 2: only the rank's own figures, under rank_2/.
    got.clear();
    for (const auto& s : tb::step_scalars(m, false, "rank_2/")) got[s.tag] = s.value;
    const std::map<std::string, float> own = {
        {"rank_2/step_time_s", 0.25f}, {"rank_2/mem_peak_bytes", 1e6f}, {"rank_2/extra.loss", 7}};
    CHECK(got == own);
  }

  TEST_CASE("the callback writes one file per rank that writes, and nothing when disabled") {
    const fs::path run = fs::temp_directory_path() / ("tb-unit-" + std::to_string(::getpid()));
    fs::remove_all(run);
    RunContext ctx;
    ctx.run_dir = run.string();
    StepMetrics m;
    m.step = 1, m.total_steps = 2;
    {
      ctx.rank = 1, ctx.world_size = 2;
      TensorBoardCallback off_rank(make_options(), ctx);  // rank 1 without all_ranks
      CHECK(off_rank.dir().empty());
      ctx.rank = 0;
      TensorBoardCallback disabled(make_options({{"enabled", false}}), ctx);
      CHECK(disabled.dir().empty());
      disabled.on_train_start(TrainPlan{});
      disabled.on_step_end(m);
      disabled.on_train_end(TrainSummary{});
      CHECK(files_in(run / "tb").empty());
    }
    {
      ctx.rank = 0;
      TensorBoardCallback cb(make_options({{"every_n_steps", int64_t{2}}}), ctx);
      cb.on_train_start(TrainPlan{});
      const std::string path = cb.path();
      CHECK(fs::path(path).parent_path() == run / "tb");
      CHECK(fs::path(path).filename().string().rfind("events.out.tfevents.", 0) == 0);
      const std::string first = tb::frame_record(tb::file_version_event(0)).substr(0, 8);
      const auto size_after_start = read_all(path).size();
      cb.on_step_end(m);  // step 1 of 2 with every_n_steps = 2: not written
      CHECK(read_all(path).size() == size_after_start);
      m.step = 2;  // the last step is always written, and flushed at once
      cb.on_step_end(m);
      const std::string content = read_all(path);
      CHECK(content.size() > size_after_start);
      CHECK(content.substr(0, 8) == first);  // the file_version record comes first
      cb.on_train_end(TrainSummary{});
    }
    CHECK(files_in(run / "tb").size() == 1);
    fs::remove_all(run);
  }
}
