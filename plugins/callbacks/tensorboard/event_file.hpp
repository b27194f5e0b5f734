#pragma once
// TensorBoard event files without TensorFlow or libprotobuf: the TFRecord framing and the few
// protobuf fields of tensorboard/compat/proto/{event,summary,tensor}.proto that scalars and a
// text summary need, encoded by hand. (LibTorch carries its own libprotobuf; a second one in the
// same process can clash at load time, and the wire format of five messages is small.)
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace trainrun::plugins::tensorboard {

/// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes, continuing from `crc`
/// (0 to start). crc32c("123456789") == 0xE3069283 (RFC 3720 B.4 check value).
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

/// The masked CRC TFRecord stores: ((c >> 15) | (c << 17)) + 0xa282ead8, c = crc32c(data).
uint32_t masked_crc32c(const void* data, size_t size);

/// One TFRecord: uint64 length (little-endian), masked CRC-32C of those 8 bytes, the data,
/// masked CRC-32C of the data.
std::string frame_record(const std::string& data);

/// One Summary.Value{tag, simple_value}.
struct Scalar {
  std::string tag;
  float value = 0;
};

/// Serialised Event{wall_time, file_version = "brain.Event:2"}: the first record of every file.
std::string file_version_event(double wall_time);

/// Serialised Event{wall_time, step, summary{value: one Summary.Value per scalar}}.
/// wall_time in seconds since the Unix epoch.
std::string scalars_event(double wall_time, int64_t step, const std::vector<Scalar>& scalars);

/// Serialised Event with one Summary.Value{tag, metadata.plugin_data.plugin_name = "text",
/// tensor = TensorProto{dtype DT_STRING, scalar shape, string_val = text}}, which TensorBoard's
/// text plugin renders as Markdown (what tf.summary.text writes).
std::string text_event(double wall_time, int64_t step, const std::string& tag,
                       const std::string& text);

/// `events.out.tfevents.<secs>.<host>.<pid>.<n>`, n counting the writers of this process.
std::string event_file_name(int64_t secs);

/// Appends framed events to one event file. Each write() is flushed to the kernel before it
/// returns, so a crash loses nothing written. Throws trainrun::v1::Error naming the file when
/// it cannot be created or written.
class EventFileWriter {
 public:
  /// Creates `dir` (and parents) and a new event file in it, starting with the file_version
  /// record.
  explicit EventFileWriter(const std::string& dir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  /// Frames and appends one serialised Event, then flushes.
  void write(const std::string& event);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

/// Seconds since the Unix epoch, with sub-second precision (Event.wall_time).
double wall_time_now();

}  // namespace trainrun::plugins::tensorboard
