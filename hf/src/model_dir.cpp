// Hugging Face model directories (see trainrun/hf/model_dir.hpp).
#include "trainrun/hf/model_dir.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainrun/error.hpp"

namespace fs = std::filesystem;

namespace trainrun::hf {

using v1::ConfigError;

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  TR_CHECK_TYPED(ConfigError, f.good(), "cannot read ", path);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

void write_text_file(const std::string& path, const std::string& text) {
  const fs::path target(path);
  const fs::path tmp = target.parent_path() / ("." + target.filename().string() + ".tmp-" +
                                               std::to_string(::getpid()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    TR_CHECK(f.good(), "cannot write ", tmp.string());
    f << text;
    f.flush();
    TR_CHECK(f.good(), "cannot write ", tmp.string(), " (disk full?)");
  }
  const int fd = ::open(tmp.c_str(), O_RDONLY);
  if (fd >= 0) ::fsync(fd), ::close(fd);
  fs::rename(tmp, target);
}

int64_t parse_size(const std::string& text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  TR_CHECK_TYPED(ConfigError, i > 0, "size '", text, "': expected a number with an optional unit "
                 "(\"5GB\", \"500MB\", \"2GiB\")");
  double v = 0;
  try {
    v = std::stod(text.substr(0, i));
  } catch (const std::exception&) {
    TR_CHECK_TYPED(ConfigError, false, "size '", text, "': not a number");
  }
  std::string unit;
  for (size_t k = i; k < text.size(); ++k)
    if (!std::isspace(static_cast<unsigned char>(text[k]))) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(text[k])));
  // transformers' convert_file_size_to_int: KB/MB/GB are powers of 10, KIB/MIB/GIB of 2.
  static const std::vector<std::pair<std::string, double>> units = {
      {"", 1},          {"B", 1},           {"KB", 1e3},          {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12},       {"KIB", 1024.0},      {"MIB", 1048576.0},
      {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  for (const auto& [u, f] : units)
    if (u == unit) return static_cast<int64_t>(v * f);
  TR_CHECK_TYPED(ConfigError, false, "size '", text, "': unknown unit '", unit,
                 "' (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  return 0;
}

ModelDir::ModelDir(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  TR_CHECK_TYPED(ConfigError, fs::is_directory(dir_, ec), "model directory '", dir_,
                 "' does not exist or is not a directory");
  const fs::path d(dir_);
  TR_CHECK_TYPED(ConfigError, fs::is_regular_file(d / "config.json", ec), "model directory '", dir_,
                 "' has no config.json (expected a Hugging Face model directory, as "
                 "save_pretrained writes)");
  config_text_ = read_text_file((d / "config.json").string());
  auto open = [&](const fs::path& p) {
    try {
      files_.push_back(std::make_unique<SafetensorsFile>(p.string()));
    } catch (const v1::Error& e) {
      throw ConfigError(e.what());
    }
    for (const auto& e : files_.back()->entries()) {
      TR_CHECK_TYPED(ConfigError, !where_.count(e.name), dir_, ": tensor '", e.name,
                     "' appears in two weight files");
      where_[e.name] = files_.size() - 1;
      names_.push_back(e.name);
    }
  };
  const fs::path index = d / "model.safetensors.index.json";
  if (fs::is_regular_file(index, ec)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_text_file(index.string()));
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(index.string() + ": not valid JSON: " + trainrun::v1::parse_error_text(e.what()));
    }
    TR_CHECK_TYPED(ConfigError, j.contains("weight_map") && j["weight_map"].is_object(),
                   index.string(), ": no \"weight_map\" object");
    std::vector<std::string> shards;
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      TR_CHECK_TYPED(ConfigError, shard.is_string(), index.string(), ": weight_map[\"", tensor,
                     "\"] is not a file name");
      const std::string s = shard.get<std::string>();
      if (std::find(shards.begin(), shards.end(), s) == shards.end()) shards.push_back(s);
    }
    std::sort(shards.begin(), shards.end());
    for (const auto& s : shards) {
      TR_CHECK_TYPED(ConfigError, fs::is_regular_file(d / s, ec), index.string(), ": shard '", s,
                     "' is listed in the index but missing from ", dir_);
      open(d / s);
    }
    for (const auto& [tensor, shard] : j["weight_map"].items()) {
      auto it = where_.find(tensor);
      TR_CHECK_TYPED(ConfigError, it != where_.end() &&
                         fs::path(files_[it->second]->path()).filename() == shard.get<std::string>(),
                     index.string(), ": tensor '", tensor, "' is listed in shard '",
                     shard.get<std::string>(), "' but that file does not hold it");
    }
  } else {
    TR_CHECK_TYPED(ConfigError, fs::is_regular_file(d / "model.safetensors", ec), "model directory '",
                   dir_, "' has neither model.safetensors nor model.safetensors.index.json "
                   "(only safetensors weights are read; convert .bin files with transformers' "
                   "save_pretrained(safe_serialization=True))");
    open(d / "model.safetensors");
  }
}

ModelDir::~ModelDir() = default;

bool ModelDir::contains(const std::string& name) const { return where_.count(name) > 0; }

const SafetensorsFile& ModelDir::file_for(const std::string& name) const {
  auto it = where_.find(name);
  TR_CHECK_TYPED(ConfigError, it != where_.end(), dir_, ": no tensor '", name, "' in the weights");
  return *files_[it->second];
}

const TensorEntry& ModelDir::entry(const std::string& name) const {
  return *file_for(name).find(name);
}

const std::string& ModelDir::file_of(const std::string& name) const { return file_for(name).path(); }

at::Tensor ModelDir::read(const std::string& name) const { return file_for(name).read(name); }

at::Tensor ModelDir::read_range(const std::string& name, int64_t offset, int64_t count) const {
  return file_for(name).read_range(name, offset, count);
}

int64_t ModelDir::total_bytes() const {
  int64_t n = 0;
  for (const auto& f : files_)
    for (const auto& e : f->entries()) n += static_cast<int64_t>(e.end - e.begin);
  return n;
}

std::vector<std::string> write_model_weights(const std::string& dir,
                                             const std::vector<v1::NamedTensor>& tensors,
                                             int64_t max_shard_bytes) {
  fs::create_directories(dir);
  // Greedy in state-dict order, as transformers' split_torch_state_dict_into_shards does.
  std::vector<std::vector<v1::NamedTensor>> shards(1);
  int64_t cur = 0, total = 0;
  for (const auto& t : tensors) {
    const int64_t bytes = t.tensor.numel() * static_cast<int64_t>(t.tensor.element_size());
    if (max_shard_bytes > 0 && cur > 0 && cur + bytes > max_shard_bytes) shards.emplace_back(), cur = 0;
    shards.back().push_back(t);
    cur += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, meta);
    written.push_back("model.safetensors");
    std::error_code ec;
    fs::remove(fs::path(dir) / "model.safetensors.index.json", ec);  // a stale index would win
    return written;
  }
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    write_safetensors((fs::path(dir) / name).string(), shards[k], meta);
    for (const auto& t : shards[k]) weight_map[t.name] = name;
    written.push_back(name);
  }
  nlohmann::ordered_json idx;
  idx["metadata"] = {{"total_size", total}};
  idx["weight_map"] = weight_map;
  write_text_file((fs::path(dir) / "model.safetensors.index.json").string(), idx.dump(2) + "\n");
  written.push_back("model.safetensors.index.json");
  return written;
}

std::vector<std::string> copy_tokenizer_files(const std::string& from, const std::string& to) {
  std::vector<std::string> copied;
  fs::create_directories(to);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                        "chat_template.jinja"}) {
    std::error_code ec;
    if (!fs::is_regular_file(fs::path(from) / f, ec)) continue;
    fs::copy_file(fs::path(from) / f, fs::path(to) / f, fs::copy_options::overwrite_existing);
    copied.push_back(f);
  }
  return copied;
}

}  // namespace trainrun::hf
