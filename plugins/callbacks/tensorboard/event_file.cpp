#include "event_file.hpp"

#include <trainrun/error.hpp>

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace trainrun::plugins::tensorboard {

namespace {

// Byte-at-a-time table for the reflected Castagnoli polynomial. An event is a few hundred bytes
// and a step writes one, so the slicing-by-8 or SSE4.2 variants would buy nothing measurable.
const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): each field is a
// varint key (field_number << 3 | wire_type) followed by its value. Only the wire types these
// messages use appear here.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

class ProtoWriter {
 public:
  void varint(uint32_t field, uint64_t v) {
    key(field, kVarint);
    raw_varint(v);
  }
  void fixed64_double(uint32_t field, double v) {
    key(field, kFixed64);
    uint64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    little_endian(bits, 8);
  }
  void fixed32_float(uint32_t field, float v) {
    key(field, kFixed32);
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    little_endian(bits, 4);
  }
  /// string, bytes and embedded messages alike.
  void bytes(uint32_t field, const std::string& v) {
    key(field, kLengthDelimited);
    raw_varint(v.size());
    out_ += v;
  }
  std::string take() { return std::move(out_); }

 private:
  void key(uint32_t field, WireType type) { raw_varint((uint64_t{field} << 3) | type); }
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void little_endian(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  }
  std::string out_;
};

// Field numbers, from tensorboard/compat/proto/*.proto.
namespace event { constexpr uint32_t wall_time = 1, step = 2, file_version = 3, summary = 5; }
namespace summary { constexpr uint32_t value = 1; }
namespace value { constexpr uint32_t tag = 1, simple_value = 2, tensor = 8, metadata = 9; }
namespace metadata { constexpr uint32_t plugin_data = 1, data_class = 4; }
namespace plugin_data { constexpr uint32_t plugin_name = 1; }
namespace tensor { constexpr uint32_t dtype = 1, tensor_shape = 2, string_val = 8; }
constexpr uint64_t kDtString = 7;        // types.proto DT_STRING
constexpr uint64_t kDataClassTensor = 2;  // summary.proto DATA_CLASS_TENSOR

std::string event_with_summary(double wall_time, int64_t step, const std::string& summary) {
  ProtoWriter e;
  e.fixed64_double(event::wall_time, wall_time);
  // int64 is a varint of the two's complement; proto3 omits zero, as its encoders do.
  if (step != 0) e.varint(event::step, static_cast<uint64_t>(step));
  e.bytes(event::summary, summary);
  return e.take();
}

std::atomic<int> g_writers{0};

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto& table = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& data) {
  std::string out;
  out.reserve(data.size() + 16);
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  };
  put(data.size(), 8);
  put(masked_crc32c(out.data(), 8), 4);
  out += data;
  put(masked_crc32c(data.data(), data.size()), 4);
  return out;
}

std::string file_version_event(double wall_time) {
  ProtoWriter e;
  e.fixed64_double(event::wall_time, wall_time);
  e.bytes(event::file_version, "brain.Event:2");
  return e.take();
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars) {
  ProtoWriter s;
  for (const Scalar& sc : scalars) {
    ProtoWriter v;
    v.bytes(value::tag, sc.tag);
    v.fixed32_float(value::simple_value, sc.value);
    s.bytes(summary::value, v.take());
  }
  return event_with_summary(wall_time, step, s.take());
}

std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text) {
  ProtoWriter pd;
  pd.bytes(plugin_data::plugin_name, "text");
  ProtoWriter md;
  md.bytes(metadata::plugin_data, pd.take());
  md.varint(metadata::data_class, kDataClassTensor);
  ProtoWriter t;
  t.varint(tensor::dtype, kDtString);
  t.bytes(tensor::tensor_shape, "");  // a TensorShapeProto with no dims: a scalar
  t.bytes(tensor::string_val, text);
  ProtoWriter v;
  v.bytes(value::tag, tag);
  v.bytes(value::tensor, t.take());
  v.bytes(value::metadata, md.take());
  ProtoWriter s;
  s.bytes(summary::value, v.take());
  return event_with_summary(wall_time, step, s.take());
}

std::string event_file_name(int64_t secs) {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  char secs_text[32];
  std::snprintf(secs_text, sizeof secs_text, "%010lld", static_cast<long long>(secs));
  return std::string("events.out.tfevents.") + secs_text + "." + host + "." +
         std::to_string(getpid()) + "." + std::to_string(g_writers.fetch_add(1));
}

double wall_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

EventFileWriter::EventFileWriter(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  TR_CHECK(!ec, "tensorboard: cannot create '", dir, "': ", ec.message());
  const double now = wall_time_now();
  path_ = (fs::path(dir) / event_file_name(static_cast<int64_t>(now))).string();
  file_ = std::fopen(path_.c_str(), "wb");
  TR_CHECK(file_ != nullptr, "tensorboard: cannot create '", path_, "': ", std::strerror(errno));
  write(file_version_event(now));
}

EventFileWriter::~EventFileWriter() {
  if (file_) std::fclose(file_);
}

void EventFileWriter::write(const std::string& event) {
  const std::string record = frame_record(event);
  const bool ok = std::fwrite(record.data(), 1, record.size(), file_) == record.size() &&
                  std::fflush(file_) == 0;
  TR_CHECK(ok, "tensorboard: writing '", path_, "' failed: ", std::strerror(errno));
}

}  // namespace trainrun::plugins::tensorboard
