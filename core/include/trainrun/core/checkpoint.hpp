#pragma once
// Checkpoint I/O: a checkpoint is a directory step-NNNNNNN/ holding meta.json (format version,
// step, data position, world size, strategy, the job, plugin versions, per-rank RNG states,
// component states, a sha256 per file and the index of every tensor's slices) and per-rank
// safetensors files of pieces (model-RRRRR-of-WWWWW.safetensors, optim-RRRRR-of-WWWWW.safetensors).
// Written into step-NNNNNNN.tmp-<pid>/, files and directories fsynced, then renamed; `latest`
// (a small file naming the directory) is replaced by an atomic rename; keep_last prunes only
// after the new checkpoint is complete. Loading maps the saved slices onto whatever pieces the
// loading strategy holds, so any layout loads into any other.
#include <trainrun/interfaces.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace trainrun::core {

constexpr int kCheckpointFormatVersion = 1;

/// A checkpoint that fails verification (missing or corrupt file, checksum mismatch, bad
/// meta.json); the message names the file.
class CheckpointError : public v1::Error {
 public:
  using v1::Error::Error;
};

/// Everything a save needs from the trainer. Pieces alias live tensors; only those with
/// writer == true are written by this rank.
struct CheckpointSaveRequest {
  std::string root;            ///< the checkpoints directory
  int64_t step = 0;            ///< optimizer steps done
  int64_t steps_per_epoch = 1;
  int64_t global_batch_size = 0;
  int64_t total_steps = 0;
  int rank = 0, world_size = 1;
  int64_t keep_last = 0;       ///< 0 = keep all
  std::string reason;          ///< "step", "signal", "end" (recorded)
  nlohmann::json job;          ///< {"file", "strategy", "toml", "plugins": [...]}
  nlohmann::json trainer_state;  ///< e.g. {"skipped_steps": n}
  std::map<std::string, std::map<std::string, double>> component_state;  ///< rank 0's
  std::vector<v1::CheckpointPiece> model, optimizer;
};

/// Writes a checkpoint collectively (every rank calls it in the same order; `comm` may be null
/// for a world of one) and returns its final path. Throws v1::Error naming the file on I/O
/// failure; a failed save leaves earlier checkpoints and `latest` untouched.
std::string save_checkpoint(const CheckpointSaveRequest& req, v1::Communicator* comm);

/// "step-0000010".
std::string checkpoint_name(int64_t step);

/// The checkpoint `resume` names: "latest" (the `latest` file of `root`), "latest-valid" (the
/// newest step-* directory of `root` that verifies; each one skipped is reported), or a path.
/// Throws ConfigError when there is none, CheckpointError when the one named does not verify.
std::string resolve_checkpoint(const std::string& resume, const std::string& root, bool log);

/// Checks meta.json and every file's size and sha256; returns meta.json. Throws CheckpointError
/// naming the file at fault.
nlohmann::json verify_checkpoint(const std::string& dir);

/// Copies into every target piece (name, full shape, offset, data) the elements it covers from
/// section `section` ("model" or "optimizer") of a verified checkpoint, whatever layout wrote
/// them. Throws CheckpointError on a tensor missing from the checkpoint, a shape that differs or
/// elements no saved slice covers.
void load_checkpoint_pieces(const std::string& dir, const nlohmann::json& meta,
                            const std::string& section, std::vector<v1::CheckpointPiece>& targets);

/// Restores this rank's torch CPU generator state from meta (when world sizes match; returns
/// false otherwise, leaving the generator as it is).
bool restore_rng_state(const nlohmann::json& meta, int rank, int world_size);

/// Optimizer state as pieces: a state tensor "<param>.<state>" whose shape equals its optimizer
/// parameter's is a piece of a tensor of the parameter's full shape at the parameter piece's
/// offset; any other state (a 0-d step counter) is whole, written by the writer of the piece at
/// offset 0. Throws Error on a state tensor not named after an optimizer parameter.
std::vector<v1::CheckpointPiece> optimizer_state_pieces(
    const std::vector<v1::CheckpointPiece>& param_pieces, const std::vector<v1::NamedTensor>& state);

/// Consolidates a checkpoint's model into full tensors, streaming one output tensor at a time:
/// writes <out>/model.safetensors, or model-0000k-of-0000n.safetensors plus an HF-style
/// model.safetensors.index.json when the tensors exceed max_shard_bytes (0 = one file).
/// Returns the number of tensors written.
int64_t consolidate_checkpoint(const std::string& dir, const std::string& out, int64_t max_shard_bytes);

}  // namespace trainrun::core
