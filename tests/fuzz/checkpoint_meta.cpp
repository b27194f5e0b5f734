// Fuzz target `checkpoint_meta`: meta.json text -> everything that reads a checkpoint through
// it: verify_checkpoint (format, version, per-file sizes and sha256), load_checkpoint_pieces
// (the tensor index: shapes, slices, files and keys), restore_rng_state (base64 RNG states) and
// consolidate_checkpoint. The target first writes a real checkpoint of a small model with
// save_checkpoint; each input replaces its meta.json, so an input close to the real one reaches
// the index and the tensor files. TRAINRUN_FUZZ_EXPORT_SEED=DIR copies the real meta.json into
// DIR (scripts/fuzz seeds the corpus with it).
#include <cstdlib>
#include <filesystem>

#include <ATen/ATen.h>

#include "fuzz_input.hpp"
#include "trainrun/core/checkpoint.hpp"

using namespace trainrun;
namespace fs = std::filesystem;

namespace {

v1::CheckpointPiece piece(const std::string& name, std::vector<int64_t> shape, int64_t offset,
                          int64_t count) {
  return {{name, std::move(shape), offset, at::arange(offset, offset + count, at::kFloat)}, true};
}

// Model "layer.weight" [3, 4] in two pieces (keys "layer.weight" and "layer.weight@6"),
// "layer.bias" [4]; optimizer state for both plus a 0-d step.
std::vector<v1::CheckpointPiece> model_pieces() {
  return {piece("layer.weight", {3, 4}, 0, 6), piece("layer.weight", {3, 4}, 6, 6),
          piece("layer.bias", {4}, 0, 4)};
}
std::vector<v1::CheckpointPiece> optimizer_pieces() {
  return {piece("layer.weight.exp_avg", {3, 4}, 0, 12), piece("layer.bias.exp_avg", {4}, 0, 4),
          {{"step", {}, 0, at::ones({1}, at::kFloat)}, true}};
}

const std::string& checkpoint_dir() {
  static const std::string dir = [] {
    core::CheckpointSaveRequest req;
    req.root = fuzz::scratch_dir() + "/checkpoints";
    req.step = 10;
    req.steps_per_epoch = 4;
    req.global_batch_size = 8;
    req.total_steps = 20;
    req.reason = "step";
    req.job = {{"file", "job.toml"}, {"strategy", "single"}, {"toml", "[trainer]\n"}, {"plugins", nlohmann::json::array()}};
    req.trainer_state = {{"skipped_steps", 0}};
    req.component_state["lr_schedule"]["last_lr"] = 0.001;
    req.model = model_pieces();
    req.optimizer = optimizer_pieces();
    const std::string d = core::save_checkpoint(req, nullptr);
    if (const char* seed = std::getenv("TRAINRUN_FUZZ_EXPORT_SEED")) {
      fs::create_directories(seed);
      fs::copy_file(fs::path(d) / "meta.json", fs::path(seed) / "saved-meta.json",
                    fs::copy_options::overwrite_existing);
    }
    return d;
  }();
  return dir;
}

}  // namespace

// The real checkpoint is written (and fsynced) before the first input, outside the per-input
// -timeout.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  checkpoint_dir();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& dir = checkpoint_dir();
  fuzz::write_file(dir + "/meta.json", data, size);
  fuzz::expect_clean([&] {
    const nlohmann::json meta = core::verify_checkpoint(dir);
    // Each reader on its own: one that refuses must not hide what the next would do.
    fuzz::expect_clean([&] {
      auto targets = model_pieces();
      core::load_checkpoint_pieces(dir, meta, "model", targets);
    });
    fuzz::expect_clean([&] {
      auto targets = optimizer_pieces();
      core::load_checkpoint_pieces(dir, meta, "optimizer", targets);
    });
    fuzz::expect_clean([&] { core::restore_rng_state(meta, 0, 1); });
    fuzz::expect_clean([&] { core::consolidate_checkpoint(dir, fuzz::scratch_dir() + "/out", 16); });
  });
  return 0;
}
