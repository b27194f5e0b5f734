#include "trainrun/core/safetensors.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "trainrun/error.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {

namespace {

const std::vector<std::pair<at::ScalarType, const char*>>& dtype_table() {
  static const std::vector<std::pair<at::ScalarType, const char*>> t = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"},   {at::kBFloat16, "BF16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kShort, "I16"},  {at::kChar, "I8"},
      {at::kByte, "U8"},    {at::kBool, "BOOL"}};
  return t;
}

const char* dtype_code(at::ScalarType t, const std::string& name) {
  for (const auto& [k, v] : dtype_table())
    if (k == t) return v;
  throw v1::Error("safetensors: tensor '" + name + "' has dtype " + std::string(c10::toString(t)) +
                  ", which safetensors cannot store here");
}

void fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) throw v1::Error("cannot open " + path + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw v1::Error("fsync " + path + ": " + std::strerror(errno));
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<v1::NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> cpu;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    TR_CHECK(t.tensor.defined(), "safetensors: tensor '", t.name, "' is undefined");
    TR_CHECK(!header.contains(t.name), "safetensors: tensor name '", t.name, "' appears twice");
    at::Tensor c = t.tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * c.element_size();
    header[t.name] = {{"dtype", dtype_code(c.scalar_type(), t.name)},
                      {"shape", c.sizes().vec()},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(c));
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
    for (const auto& c : cpu)
      f.write(static_cast<const char*>(c.data_ptr()),
              static_cast<std::streamsize>(c.numel() * c.element_size()));
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
  std::ifstream f(path, std::ios::binary);
  TR_CHECK(f.good(), "cannot read ", path);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  TR_CHECK(bytes.size() >= 8, path, ": not a safetensors file (", bytes.size(), " bytes)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  TR_CHECK(n <= bytes.size() - 8, path, ": header of ", n, " bytes runs past the end of the file (",
           bytes.size(), " bytes): truncated?");
  nlohmann::ordered_json header;
  try {
    header = nlohmann::ordered_json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<int64_t>(n));
  } catch (const std::exception& e) {
    throw v1::Error(path + ": malformed safetensors header: " + e.what());
  }
  const uint64_t data_size = bytes.size() - 8 - n;
  const char* data = bytes.data() + 8 + n;
  std::vector<v1::NamedTensor> out;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (metadata)
        for (const auto& [k, val] : v.items()) (*metadata)[k] = val.get<std::string>();
      continue;
    }
    try {
      const std::string code = v.at("dtype").get<std::string>();
      at::ScalarType type = at::kFloat;
      bool found = false;
      for (const auto& [k, c] : dtype_table())
        if (code == c) type = k, found = true;
      TR_CHECK(found, "unsupported dtype ", code);
      const auto shape = v.at("shape").get<std::vector<int64_t>>();
      const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      TR_CHECK(off.size() == 2 && off[0] <= off[1] && off[1] <= data_size, "data_offsets [",
               off.size() ? off[0] : 0, ", ", off.size() > 1 ? off[1] : 0, "] outside the ",
               data_size, " data bytes (truncated file?)");
      at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
      TR_CHECK(static_cast<uint64_t>(t.numel() * t.element_size()) == off[1] - off[0],
               "shape and data_offsets disagree");
      std::memcpy(t.data_ptr(), data + off[0], off[1] - off[0]);
      out.push_back({name, t});
    } catch (const std::exception& e) {
      throw v1::Error(path + ": tensor '" + name + "': " + e.what());
    }
  }
  return out;
}

}  // namespace trainrun::core
