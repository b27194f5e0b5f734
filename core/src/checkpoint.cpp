// Checkpoint I/O (see checkpoint.hpp for the format). Durability follows the usual POSIX
// recipe: data written to files in a temporary directory, each file fsynced, the directory
// fsynced, renamed into place, the parent fsynced; a reader only ever looks at directories that
// meta.json makes complete, and meta.json is written last. The index lists, per tensor, the
// slices of its flattening each file holds, which is what lets a checkpoint written by one
// layout (strategy, world size) load into another.
#include "trainrun/core/checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include "trainrun/core/log.hpp"
#include "trainrun/core/safetensors.hpp"
#include "trainrun/hf/safetensors.hpp"
#include "trainrun/error.hpp"

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace trainrun::core {

namespace {

std::string rank_file(const char* kind, int rank, int world) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-%05d-of-%05d.safetensors", kind, rank, world);
  return buf;
}

void fsync_path(const fs::path& path, bool dir) {
  const int fd = ::open(path.c_str(), dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) throw v1::Error("cannot open " + path.string() + " to sync it: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw v1::Error("fsync " + path.string() + ": " + std::strerror(errno));
}

void write_file_synced(const fs::path& path, const std::string& text) {
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text;
    f.flush();
    if (!f) throw v1::Error("cannot write " + path.string() + " (disk full?)");
  }
  fsync_path(path, false);
}

std::string sha256_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CheckpointError("checkpoint file " + path.string() + " is missing or unreadable");
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (f.gcount() > 0) EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(f.gcount()));
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx, md, &n);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) out += hex[md[i] >> 4], out += hex[md[i] & 15];
  return out;
}

std::string base64(const at::Tensor& bytes) {
  const auto n = static_cast<int>(bytes.numel());
  std::string out(static_cast<size_t>(4 * ((n + 2) / 3)) + 1, '\0');
  const int m = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                bytes.data_ptr<uint8_t>(), n);
  out.resize(static_cast<size_t>(m));
  return out;
}

at::Tensor unbase64(const std::string& text, int64_t expected) {
  std::string buf(text.size(), '\0');
  const int m = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(buf.data()),
                                reinterpret_cast<const unsigned char*>(text.data()),
                                static_cast<int>(text.size()));
  TR_CHECK(m >= expected, "rng state: ", m, " bytes decoded, ", expected, " expected");
  at::Tensor t = at::empty({expected}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), buf.data(), static_cast<size_t>(expected));
  return t;
}

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

// Test hook for the crash-during-write test: TRAINRUN_CHECKPOINT_CRASH_AT=<point>@<step> makes
// the process kill itself with SIGKILL at that point of the save of that step (as `kill -9`
// would), on rank TRAINRUN_CHECKPOINT_CRASH_RANK (default 0).
void crash_point(const char* point, int64_t step, int rank) {
  static const char* spec = std::getenv("TRAINRUN_CHECKPOINT_CRASH_AT");
  if (spec == nullptr) return;
  const std::string s(spec);
  const auto at = s.find('@');
  if (s.substr(0, at) != point) return;
  if (at != std::string::npos && std::stoll(s.substr(at + 1)) != step) return;
  const char* r = std::getenv("TRAINRUN_CHECKPOINT_CRASH_RANK");
  if ((r ? std::atoi(r) : 0) != rank) return;
  std::fprintf(stderr, "checkpoint test hook: SIGKILL at %s (step %lld, rank %d)\n", point,
               static_cast<long long>(step), rank);
  std::fflush(stderr);
  ::kill(::getpid(), SIGKILL);
}

void barrier(v1::Communicator* comm) {
  if (comm != nullptr && comm->world_size() > 1) comm->barrier()->wait();
}

// One safetensors file opened for reading single tensors (the hf library's byte-range reader:
// header parsed once, data read by offset), so loading and consolidating never hold a whole
// file. Its errors become CheckpointErrors.
class TensorFile {
 public:
  explicit TensorFile(const fs::path& path) : path_(path) {
    try {
      file_ = std::make_unique<hf::SafetensorsFile>(path.string());
    } catch (const v1::Error& e) {
      throw CheckpointError(e.what());
    }
  }
  bool has(const std::string& key) const { return file_->find(key) != nullptr; }
  /// Elements stored under `key`.
  int64_t numel(const std::string& key) const {
    const hf::TensorEntry* e = file_->find(key);
    if (e == nullptr) throw CheckpointError(path_.string() + ": no tensor '" + key + "'");
    return e->numel();
  }
  /// The tensor stored under `key`, flattened, or elements [lo, lo + len) of it.
  at::Tensor read(const std::string& key, int64_t lo = 0, int64_t len = -1) {
    const hf::TensorEntry* e = file_->find(key);
    if (e == nullptr) throw CheckpointError(path_.string() + ": no tensor '" + key + "'");
    if (len < 0) len = e->numel() - lo;
    try {
      return file_->read_range(key, lo, len);
    } catch (const v1::Error& ex) {
      throw CheckpointError(ex.what());
    }
  }

 private:
  fs::path path_;
  std::unique_ptr<hf::SafetensorsFile> file_;
};

// meta.json comes from disk: a value of the wrong JSON type, or one LibTorch refuses (a
// negative size, a slice past a tensor's end), means a damaged checkpoint. Called from a catch
// block: rethrows the exception in flight as a CheckpointError naming meta.json.
[[noreturn]] void rethrow_as_damaged(const std::string& dir) {
  const std::string where = dir.empty() ? std::string("checkpoint meta.json")
                                        : "checkpoint " + (fs::path(dir) / "meta.json").string();
  try {
    throw;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(where + ": malformed (" + v1::parse_error_text(e.what()) + ")");
  } catch (const c10::Error& e) {
    throw CheckpointError(where + ": " + e.what_without_backtrace());
  }
}

// A name of an entry of one directory, not a path: "../x", "/etc/x" or "a/b" would lead a
// damaged or hostile file (meta.json, `latest`) to read, or the next save to prune, outside it.
bool is_plain_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// An untrusted name (from meta.json or `latest`) as an error quotes it: its first 40 characters,
// '?' for any that is not printable ASCII, "..." where it was cut.
std::string shown_name(const std::string& name) {
  std::string shown = name.substr(0, 40);
  for (char& c : shown)
    if (c < 0x20 || c > 0x7e) c = '?';
  return name.size() > 40 ? shown + "..." : shown;
}

// A file meta.json names lives in the checkpoint's own directory (is_plain_name).
void require_plain_name(const fs::path& meta, const std::string& name) {
  if (is_plain_name(name)) return;
  throw CheckpointError("checkpoint " + meta.string() + ": damaged: names the file '" + shown_name(name) +
                        "', which is not a plain file name in the checkpoint's directory");
}

// The tensor file `name` of checkpoint `dir`, opened once per name into `files`.
TensorFile& piece_file(std::map<std::string, std::unique_ptr<TensorFile>>& files,
                       const std::string& dir, const std::string& name) {
  auto& f = files[name];
  if (!f) {
    require_plain_name(fs::path(dir) / "meta.json", name);
    f = std::make_unique<TensorFile>(fs::path(dir) / name);
  }
  return *f;
}

// Elements of a shape from meta.json; a negative dimension or a product past int64 is damage.
int64_t numel_of(const std::vector<int64_t>& shape, const std::string& dir, const std::string& name) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > std::numeric_limits<int64_t>::max() / d))
      throw CheckpointError("checkpoint " + dir + ": tensor '" + name + "' has shape " +
                            c10::str(c10::IntArrayRef(shape)) + " in meta.json");
    n *= d;
  }
  return n;
}

// Writes this rank's pieces of one section; returns the index entries {name: {shape, dtype,
// slices: [{file, key, offset, length}]}}.
Json write_section(const fs::path& dir, const char* kind, const std::vector<v1::CheckpointPiece>& pieces,
                   int rank, int world) {
  const std::string file = rank_file(kind, rank, world);
  std::vector<v1::NamedTensor> tensors;
  Json index = Json::object();
  std::set<std::string> keys;
  for (const auto& cp : pieces) {
    if (!cp.writer) continue;
    const auto& p = cp.piece;
    std::string key = p.name;
    if (!keys.insert(key).second) {
      key = p.name + "@" + std::to_string(p.offset);
      TR_CHECK(keys.insert(key).second, "checkpoint: tensor '", p.name, "' offset ", p.offset,
               " listed twice by rank ", rank);
    }
    tensors.push_back({key, p.data.detach().reshape({-1})});
    auto& e = index[p.name];
    e["shape"] = p.shape;
    e["dtype"] = std::string(c10::toString(p.data.scalar_type()));
    e["slices"].push_back({{"file", file}, {"key", key}, {"offset", p.offset}, {"length", p.data.numel()}});
  }
  write_safetensors((dir / file).string(), tensors, {{"format", "pt"}});
  return index;
}

void merge_index(Json& into, const Json& from) {
  for (const auto& [name, e] : from.items()) {
    if (!into.contains(name)) {
      into[name] = e;
      continue;
    }
    for (const auto& s : e["slices"]) into[name]["slices"].push_back(s);
  }
}

// Rank 0's meta.json: the step and layout, the job, and every rank's index, file checksums and
// RNG state merged from the sidecars the ranks wrote into `tmp`.
Json checkpoint_meta(const CheckpointSaveRequest& req, const fs::path& tmp) {
  Json meta;
  meta["format"] = "trainrun-checkpoint";
  meta["format_version"] = kCheckpointFormatVersion;
  meta["step"] = req.step;
  meta["epoch"] = req.step / std::max<int64_t>(1, req.steps_per_epoch);
  meta["step_in_epoch"] = req.step % std::max<int64_t>(1, req.steps_per_epoch);
  meta["steps_per_epoch"] = req.steps_per_epoch;
  meta["global_batch_size"] = req.global_batch_size;
  meta["samples_seen"] = req.step * req.global_batch_size;
  meta["total_steps"] = req.total_steps;
  meta["world_size"] = req.world_size;
  meta["reason"] = req.reason;
  meta["job"] = req.job;
  meta["trainer_state"] = req.trainer_state;
  meta["component_state"] = req.component_state;
  Json index = {{"model", Json::object()}, {"optimizer", Json::object()}};
  Json files = Json::object();
  Json rngs = Json::array();
  for (int r = 0; r < req.world_size; ++r) {
    const fs::path sp = tmp / ("rank-" + std::to_string(r) + ".json");
    std::ifstream f(sp);
    TR_CHECK(f.good(), "checkpoint: rank ", r, " wrote no ", sp.string(),
             " (is the checkpoint directory on a file system every rank shares?)");
    const Json s = Json::parse(f);
    merge_index(index["model"], s["index"]["model"]);
    merge_index(index["optimizer"], s["index"]["optimizer"]);
    for (const auto& [fname, info] : s["files"].items()) files[fname] = info;
    rngs.push_back(s["rng"]);
  }
  meta["rng"] = rngs;
  meta["files"] = files;
  meta["tensors"] = index;
  return meta;
}

// Keeps the newest `keep_last` complete checkpoints under `root`, and always `name` (just written).
void prune_checkpoints(const fs::path& root, const std::string& name, int64_t keep_last) {
  std::error_code ec;
  std::vector<std::string> done;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find('.') == std::string::npos &&
        fs::exists(e.path() / "meta.json"))
      done.push_back(n);
  }
  std::sort(done.begin(), done.end());
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < done.size(); ++i)
    if (done[i] != name) fs::remove_all(root / done[i], ec);
}

}  // namespace

std::string checkpoint_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%07lld", static_cast<long long>(step));
  return buf;
}

std::string save_checkpoint(const CheckpointSaveRequest& req, v1::Communicator* comm) {
  const fs::path root(req.root);
  const std::string name = checkpoint_name(req.step);
  // Rank 0 names the temporary directory after its pid and tells the others.
  int64_t pid = req.rank == 0 ? static_cast<int64_t>(::getpid()) : 0;
  if (comm != nullptr && comm->world_size() > 1) {
    at::Tensor t = at::tensor({pid}, at::kLong);
    comm->broadcast(t)->wait();
    pid = t.item<int64_t>();
  }
  const fs::path tmp = root / (name + ".tmp-" + std::to_string(pid));
  if (req.rank == 0) {
    fs::create_directories(root);
    std::error_code ec;
    // What a save killed half-way left behind (never a complete checkpoint: those are renamed).
    for (const auto& e : fs::directory_iterator(root)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step-", 0) == 0 && (n.find(".tmp-") != std::string::npos || n.find(".old-") != std::string::npos))
        fs::remove_all(e.path(), ec);
    }
    fs::create_directory(tmp);
  }
  barrier(comm);
  // Every rank: its pieces, then a sidecar with its index, checksums and RNG state.
  const Json model_index = write_section(tmp, "model", req.model, req.rank, req.world_size);
  crash_point("rank-files", req.step, req.rank);
  const Json optim_index = write_section(tmp, "optim", req.optimizer, req.rank, req.world_size);
  Json side;
  side["rank"] = req.rank;
  side["index"] = {{"model", model_index}, {"optimizer", optim_index}};
  for (const char* kind : {"model", "optim"}) {
    const std::string f = rank_file(kind, req.rank, req.world_size);
    side["files"][f] = {{"sha256", sha256_file(tmp / f)}, {"bytes", fs::file_size(tmp / f)}};
  }
  const at::Tensor rng = cpu_rng_state();
  side["rng"] = {{"cpu", base64(rng)}, {"cpu_bytes", rng.numel()}};
  write_file_synced(tmp / ("rank-" + std::to_string(req.rank) + ".json"), side.dump());
  barrier(comm);
  std::string final_path = (root / name).string();
  if (req.rank == 0) {
    const Json meta = checkpoint_meta(req, tmp);
    crash_point("before-meta", req.step, req.rank);
    write_file_synced(tmp / "meta.json", meta.dump(1));
    for (int r = 0; r < req.world_size; ++r) fs::remove(tmp / ("rank-" + std::to_string(r) + ".json"));
    fsync_path(tmp, true);
    crash_point("before-rename", req.step, req.rank);
    std::error_code ec;
    if (fs::exists(root / name)) {
      // A checkpoint of this step already exists (a resumed run saving the same step again):
      // move it aside first so the rename below cannot fail half-way.
      const fs::path old = root / (name + ".old-" + std::to_string(pid));
      fs::rename(root / name, old);
      fs::rename(tmp, root / name);
      fs::remove_all(old, ec);
    } else {
      fs::rename(tmp, root / name);
    }
    fsync_path(root, true);
    crash_point("before-latest", req.step, req.rank);
    const fs::path latest_tmp = root / (".latest.tmp-" + std::to_string(pid));
    write_file_synced(latest_tmp, name + "\n");
    fs::rename(latest_tmp, root / "latest");
    fsync_path(root, true);
    crash_point("before-prune", req.step, req.rank);
    if (req.keep_last > 0) prune_checkpoints(root, name, req.keep_last);
  }
  barrier(comm);
  return final_path;
}

nlohmann::json verify_checkpoint(const std::string& dir) try {
  const fs::path d(dir);
  const fs::path mp = d / "meta.json";
  if (!fs::is_regular_file(mp))
    throw CheckpointError("checkpoint " + dir + ": no meta.json (incomplete checkpoint)");
  nlohmann::json meta;
  try {
    std::ifstream f(mp);
    meta = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw CheckpointError("checkpoint " + mp.string() + ": corrupt: " + v1::parse_error_text(e.what()));
  }
  if (meta.value("format", "") != "trainrun-checkpoint" || !meta.contains("files"))
    throw CheckpointError("checkpoint " + mp.string() + ": not a trainrun checkpoint");
  if (meta.value("format_version", 0) > kCheckpointFormatVersion)
    throw CheckpointError("checkpoint " + mp.string() + ": format version " +
                          std::to_string(meta.value("format_version", 0)) +
                          " is newer than this trainrun's " + std::to_string(kCheckpointFormatVersion));
  for (const auto& [fname, info] : meta["files"].items()) {
    require_plain_name(mp, fname);
    const fs::path p = d / fname;
    if (!fs::is_regular_file(p)) throw CheckpointError("checkpoint file " + p.string() + " is missing");
    const auto bytes = fs::file_size(p);
    if (bytes != info["bytes"].get<uint64_t>())
      throw CheckpointError("checkpoint file " + p.string() + " has " + std::to_string(bytes) +
                            " bytes, meta.json says " + std::to_string(info["bytes"].get<uint64_t>()) +
                            " (truncated?)");
    const std::string sum = sha256_file(p);
    if (sum != info["sha256"].get<std::string>())
      throw CheckpointError("checkpoint file " + p.string() + ": sha256 " + sum +
                            " differs from meta.json's " + info["sha256"].get<std::string>() +
                            " (corrupt)");
  }
  return meta;
} catch (const CheckpointError&) {
  throw;
} catch (...) {
  rethrow_as_damaged(dir);
}

std::string resolve_checkpoint(const std::string& resume, const std::string& root, bool log) {
  if (resume == "latest") {
    const fs::path lp = fs::path(root) / "latest";
    std::ifstream f(lp);
    if (!f) throw v1::ConfigError("[trainer] resume = \"latest\": no " + lp.string() + " (no checkpoint was completed there)");
    std::string name;
    std::getline(f, name);
    // `latest` names a checkpoint of this directory and nothing else.
    if (!is_plain_name(name))
      throw v1::ConfigError("[trainer] resume = \"latest\": " + lp.string() + " names \"" + shown_name(name) +
                            "\", which is not a checkpoint inside " + root +
                            " (a checkpoint reference must be a directory name such as step-0000010)");
    return (fs::path(root) / name).string();
  }
  if (resume == "latest-valid") {
    std::vector<std::string> dirs;
    if (fs::is_directory(root))
      for (const auto& e : fs::directory_iterator(root)) {
        const std::string n = e.path().filename().string();
        if (e.is_directory() && n.rfind("step-", 0) == 0 && n.find('.') == std::string::npos) dirs.push_back(n);
      }
    std::sort(dirs.rbegin(), dirs.rend());
    for (const auto& n : dirs) {
      const std::string p = (fs::path(root) / n).string();
      try {
        verify_checkpoint(p);
        if (log && n != dirs.front())
          log_warn("resume = \"latest-valid\": using " + p + ", the newest checkpoint that verifies");
        return p;
      } catch (const CheckpointError& e) {
        if (log) log_warn(std::string("resume = \"latest-valid\": skipping ") + p + ": " + e.what());
      }
    }
    throw v1::ConfigError("[trainer] resume = \"latest-valid\": no valid checkpoint in " + root);
  }
  if (!fs::is_directory(resume)) throw v1::ConfigError("[trainer] resume = \"" + resume + "\": no such checkpoint directory");
  return resume;
}

void load_checkpoint_pieces(const std::string& dir, const nlohmann::json& meta,
                            const std::string& section, std::vector<v1::CheckpointPiece>& targets) try {
  const auto& index = meta.at("tensors").at(section);
  std::map<std::string, std::unique_ptr<TensorFile>> files;
  auto file = [&](const std::string& name) -> TensorFile& { return piece_file(files, dir, name); };
  at::NoGradGuard no_grad;
  for (auto& cp : targets) {
    auto& t = cp.piece;
    // A checkpoint that does not fit this run's model is bad input (exit 2), not a failure.
    if (!index.contains(t.name))
      throw v1::ConfigError("[trainer] resume: checkpoint " + dir + " has no " + section + " tensor '" + t.name +
                            "': it is not a checkpoint of this job's model");
    const auto& e = index[t.name];
    const auto shape = e.at("shape").get<std::vector<int64_t>>();
    if (shape != t.shape)
      throw v1::ConfigError("[trainer] resume: checkpoint " + dir + ": " + section + " tensor '" + t.name +
                            "' has shape " + c10::str(c10::IntArrayRef(shape)) + ", this run's has " +
                            c10::str(c10::IntArrayRef(t.shape)) + ": it is not a checkpoint of this job's model");
    const int64_t lo = t.offset, hi = t.offset + t.data.numel();
    int64_t covered = 0;
    for (const auto& s : e.at("slices")) {
      const int64_t so = s.at("offset").get<int64_t>();
      const int64_t sl = s.at("length").get<int64_t>();
      const int64_t a = std::max(lo, so), b = std::min(hi, so + sl);
      if (a >= b) continue;
      at::Tensor part = file(s.at("file").get<std::string>()).read(s.at("key").get<std::string>(), a - so, b - a);
      t.data.narrow(0, a - lo, b - a).copy_(part);
      covered += b - a;
    }
    if (covered != hi - lo)
      throw CheckpointError("checkpoint " + dir + ": " + section + " tensor '" + t.name + "': elements [" +
                            std::to_string(lo) + ", " + std::to_string(hi) + ") are covered " +
                            std::to_string(covered) + " times, not once");
  }
} catch (const v1::Error&) {
  throw;
} catch (...) {
  rethrow_as_damaged(dir);
}

bool restore_rng_state(const nlohmann::json& meta, int rank, int world_size) try {
  if (meta.at("world_size").get<int>() != world_size) return false;
  const auto& r = meta.at("rng").at(static_cast<size_t>(rank));
  const int64_t bytes = r.at("cpu_bytes").get<int64_t>();
  TR_CHECK_TYPED(CheckpointError, bytes >= 0, "checkpoint meta.json: rank ", rank, "'s rng cpu_bytes is ", bytes);
  const at::Tensor state = unbase64(r.at("cpu").get<std::string>(), bytes);
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
  return true;
} catch (const v1::Error&) {
  throw;
} catch (...) {
  rethrow_as_damaged("");
}

std::vector<v1::CheckpointPiece> optimizer_state_pieces(
    const std::vector<v1::CheckpointPiece>& param_pieces, const std::vector<v1::NamedTensor>& state) {
  std::map<std::string, const v1::CheckpointPiece*> by_name;
  for (const auto& p : param_pieces) by_name.emplace(p.piece.name, &p);
  std::vector<v1::CheckpointPiece> out;
  for (const auto& s : state) {
    const auto dot = s.name.rfind('.');
    auto it = dot == std::string::npos ? by_name.end() : by_name.find(s.name.substr(0, dot));
    TR_CHECK(it != by_name.end(), "checkpoint: optimizer state tensor '", s.name,
             "' is not named <optimizer parameter>.<state>");
    const v1::CheckpointPiece& p = *it->second;
    TR_CHECK(s.tensor.is_contiguous(), "checkpoint: optimizer state '", s.name, "' is not contiguous");
    if (s.tensor.sizes().vec() == std::vector<int64_t>{p.piece.data.numel()} ||
        (s.tensor.numel() == p.piece.data.numel() && s.tensor.dim() > 0 && p.piece.offset == 0 &&
         s.tensor.sizes().vec() == p.piece.shape)) {
      out.push_back({{s.name, p.piece.shape, p.piece.offset, s.tensor.detach().view({-1})}, p.writer});
    } else {
      out.push_back({{s.name, s.tensor.sizes().vec(), 0, s.tensor.detach().view({-1})},
                     p.writer && p.piece.offset == 0});
    }
  }
  return out;
}

int64_t consolidate_checkpoint(const std::string& dir, const std::string& out, int64_t max_shard_bytes) try {
  const nlohmann::json meta = verify_checkpoint(dir);
  const auto& index = meta.at("tensors").at("model");
  fs::create_directories(out);
  std::map<std::string, std::unique_ptr<TensorFile>> files;
  auto file = [&](const std::string& name) -> TensorFile& { return piece_file(files, dir, name); };
  // Tensors in index order, split into output shards by size; one shard's tensors are
  // assembled and written, then dropped, so memory stays near the largest shard.
  std::vector<std::vector<std::string>> shards(1);
  int64_t cur = 0;
  for (const auto& [name, e] : index.items()) {
    const int64_t numel = numel_of(e.at("shape").get<std::vector<int64_t>>(), dir, name);
    const int64_t bytes = numel > std::numeric_limits<int64_t>::max() / 4 ? std::numeric_limits<int64_t>::max() : numel * 4;
    if (max_shard_bytes > 0 && cur > 0 && cur + bytes > max_shard_bytes) shards.emplace_back(), cur = 0;
    shards.back().push_back(name);
    cur += bytes;
  }
  const bool split = shards.size() > 1;
  Json weight_map = Json::object();
  int64_t total_bytes = 0, count = 0;
  for (size_t k = 0; k < shards.size(); ++k) {
    std::vector<v1::NamedTensor> tensors;
    for (const auto& name : shards[k]) {
      const auto& e = index[name];
      const auto shape = e.at("shape").get<std::vector<int64_t>>();
      const int64_t numel = numel_of(shape, dir, name);
      // The shape is meta.json's claim; what the slices' files hold (checksummed) bounds what
      // is allocated.
      int64_t held = 0;
      for (const auto& s : e.at("slices")) held += file(s.at("file").get<std::string>()).numel(s.at("key").get<std::string>());
      if (held != numel)
        throw CheckpointError("checkpoint " + dir + ": model tensor '" + name + "' of shape " +
                              c10::str(c10::IntArrayRef(shape)) + " has " + std::to_string(held) +
                              " elements in its slices' files");
      at::Tensor flat;
      int64_t covered = 0;
      for (const auto& s : e.at("slices")) {
        at::Tensor part = file(s.at("file").get<std::string>()).read(s.at("key").get<std::string>());
        if (!flat.defined()) flat = at::empty({numel}, part.options());
        flat.narrow(0, s.at("offset").get<int64_t>(), part.numel()).copy_(part);
        covered += part.numel();
      }
      if (covered != numel)
        throw CheckpointError("checkpoint " + dir + ": model tensor '" + name + "' covered " +
                              std::to_string(covered) + " of " + std::to_string(numel) + " elements");
      tensors.push_back({name, flat.view(shape)});
      total_bytes += flat.numel() * flat.element_size();
    }
    char fname[64];
    if (split) std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    else std::snprintf(fname, sizeof fname, "model.safetensors");
    write_safetensors((fs::path(out) / fname).string(), tensors, {{"format", "pt"}});
    for (const auto& t : tensors) weight_map[t.name] = fname;
    count += static_cast<int64_t>(tensors.size());
  }
  if (split) {
    Json idx = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
    write_file_synced(fs::path(out) / "model.safetensors.index.json", idx.dump(2));
  }
  return count;
} catch (const v1::Error&) {
  throw;
} catch (...) {
  rethrow_as_damaged(dir);
}

}  // namespace trainrun::core
