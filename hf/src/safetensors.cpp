// safetensors reading by byte range and atomic writing (see trainrun/hf/safetensors.hpp).
#include "trainrun/hf/safetensors.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainrun/error.hpp"

namespace fs = std::filesystem;

namespace trainrun::hf {

namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_table() {
  static const std::vector<std::pair<at::ScalarType, const char*>> t = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},   {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"},  {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"}};
  return t;
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw v1::Error("cannot open " + path + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw v1::Error("fsync " + path + ": " + std::strerror(errno));
}

// pread until `n` bytes are in, or fail naming the file and what was being read.
void read_exact(int fd, char* dst, uint64_t n, uint64_t offset, const std::string& path,
                const std::string& what) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, dst, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TR_CHECK(got > 0, path, ": reading ", what, " failed",
             got < 0 ? std::string(": ") + std::strerror(errno) : std::string(" (file ends early: truncated?)"));
    dst += got, n -= static_cast<uint64_t>(got), offset += static_cast<uint64_t>(got);
  }
}

}  // namespace

int64_t TensorEntry::numel() const {
  // The constructor has checked that the product fits; a zero anywhere makes it 0 even where the
  // other dimensions' product alone would not fit.
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string dtype_code(at::ScalarType t, const std::string& what) {
  for (const auto& [k, v] : dtype_table())
    if (k == t) return v;
  throw v1::Error("safetensors: tensor '" + what + "' has dtype " + std::string(c10::toString(t)) +
                  ", which safetensors cannot store here");
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TR_CHECK(fd_ >= 0, "cannot read ", path_, ": ", std::strerror(errno));
  try {
    struct stat st {};
    TR_CHECK(::fstat(fd_, &st) == 0, "cannot stat ", path_, ": ", std::strerror(errno));
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    TR_CHECK(size >= 8, path_, ": not a safetensors file (", size, " bytes)");
    unsigned char len[8];
    read_exact(fd_, reinterpret_cast<char*>(len), 8, 0, path_, "the header length");
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
    TR_CHECK(n <= size - 8, path_, ": header of ", n, " bytes runs past the end of the file (",
             size, " bytes): truncated?");
    std::string text(n, '\0');
    read_exact(fd_, text.data(), n, 8, path_, "the header");
    nlohmann::ordered_json header;
    try {
      header = nlohmann::ordered_json::parse(text);
    } catch (const std::exception& e) {
      throw v1::Error(path_ + ": malformed safetensors header: " + v1::parse_error_text(e.what()));
    }
    TR_CHECK(header.is_object(), path_, ": malformed safetensors header (not a JSON object)");
    const uint64_t data_start = 8 + n, data_size = size - data_start;
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        for (const auto& [k, val] : v.items())
          if (val.is_string()) metadata_[k] = val.get<std::string>();
        continue;
      }
      try {
        TensorEntry e;
        e.name = name;
        const std::string code = v.at("dtype").get<std::string>();
        bool found = false;
        for (const auto& [k, c] : dtype_table())
          if (code == c) e.dtype = k, found = true;
        TR_CHECK(found, "unsupported dtype ", code);
        e.shape = v.at("shape").get<std::vector<int64_t>>();
        const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
        TR_CHECK(off.size() == 2 && off[0] <= off[1], "malformed data_offsets");
        TR_CHECK(off[1] <= data_size, "data_offsets [", off[0], ", ", off[1], "] run past the ",
                 data_size, " data bytes of the file: truncated?");
        // The shape is the header's claim: its byte count must equal what data_offsets give,
        // computed without overflow (a shape of [2^62] F32 must not wrap around to 0 bytes).
        const uint64_t have = off[1] - off[0], element = c10::elementSize(e.dtype);
        bool empty = false;
        for (int64_t d : e.shape) {
          TR_CHECK(d >= 0, "shape [", c10::IntArrayRef(e.shape), "] has a negative dimension");
          empty = empty || d == 0;
        }
        uint64_t want = empty ? 0 : element;
        for (int64_t d : e.shape) {
          if (empty) break;
          TR_CHECK(want <= have / static_cast<uint64_t>(d), "shape [", c10::IntArrayRef(e.shape), "] of ",
                   code, " needs more bytes than data_offsets give (", have, ")");
          want *= static_cast<uint64_t>(d);
        }
        TR_CHECK(want == have, "shape [", c10::IntArrayRef(e.shape), "] of ", code, " needs ", want,
                 " bytes, data_offsets give ", have);
        e.begin = data_start + off[0];
        e.end = data_start + off[1];
        index_[name] = entries_.size();
        entries_.push_back(std::move(e));
      } catch (const std::exception& ex) {
        throw v1::Error(path_ + ": tensor '" + name + "': " + ex.what());
      }
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const TensorEntry* e = find(name);
  TR_CHECK(e != nullptr, path_, ": no tensor '", name, "'");
  at::Tensor t = at::empty(e->shape, at::TensorOptions().dtype(e->dtype));
  read_exact(fd_, static_cast<char*>(t.data_ptr()), e->end - e->begin, e->begin, path_,
             "tensor '" + name + "'");
  return t;
}

at::Tensor SafetensorsFile::read_range(const std::string& name, int64_t offset, int64_t count) const {
  const TensorEntry* e = find(name);
  TR_CHECK(e != nullptr, path_, ": no tensor '", name, "'");
  TR_CHECK(offset >= 0 && count >= 0 && offset + count <= e->numel(), path_, ": tensor '", name,
           "' has ", e->numel(), " elements; cannot read [", offset, ", ", offset + count, ")");
  at::Tensor t = at::empty({count}, at::TensorOptions().dtype(e->dtype));
  const uint64_t es = c10::elementSize(e->dtype);
  read_exact(fd_, static_cast<char*>(t.data_ptr()), static_cast<uint64_t>(count) * es,
             e->begin + static_cast<uint64_t>(offset) * es, path_, "tensor '" + name + "'");
  return t;
}

void write_safetensors(const std::string& path, const std::vector<v1::NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    TR_CHECK(t.tensor.defined(), "safetensors: tensor '", t.name, "' is undefined");
    TR_CHECK(!header.contains(t.name), "safetensors: tensor name '", t.name, "' appears twice");
    const uint64_t bytes = static_cast<uint64_t>(t.tensor.numel()) * t.tensor.element_size();
    header[t.name] = {{"dtype", dtype_code(t.tensor.scalar_type(), t.name)},
                      {"shape", t.tensor.sizes().vec()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  const fs::path target(path);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp-" +
                                               std::to_string(::getpid()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TR_CHECK(f.good(), "cannot write ", tmp.string());
    uint64_t n = h.size();
    unsigned char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(h.data(), static_cast<std::streamsize>(h.size()));
    // One CPU copy at a time: writing a model from accelerator memory needs one tensor's worth.
    for (const auto& t : tensors) {
      const at::Tensor c = t.tensor.detach().to(at::kCPU).contiguous();
      f.write(static_cast<const char*>(c.data_ptr()),
              static_cast<std::streamsize>(c.numel() * c.element_size()));
    }
    f.flush();
    if (!f) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw v1::Error("cannot write " + tmp.string() + " (disk full?)");
    }
  }
  fsync_path(tmp.string(), O_RDONLY);
  fs::rename(tmp, target);
  fsync_path(target.parent_path().empty() ? "." : target.parent_path().string(),
             O_RDONLY | O_DIRECTORY);
}

std::vector<v1::NamedTensor> read_safetensors(const std::string& path,
                                              std::map<std::string, std::string>* metadata) {
  SafetensorsFile f(path);
  if (metadata) *metadata = f.metadata();
  std::vector<v1::NamedTensor> out;
  for (const auto& e : f.entries()) out.push_back({e.name, f.read(e.name)});
  return out;
}

}  // namespace trainrun::hf
