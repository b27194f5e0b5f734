// `trainrun export` (export_cli.hpp). The checkpoint's model is consolidated into full tensors
// (core::consolidate_checkpoint, so sharded checkpoints of any world size work), the model
// component of the checkpoint's own job is built from meta.json's resolved job (a model from an
// HF directory leaves its weights unread: ABI 1.7 DeferredWeights), and the consolidated state
// goes to its FinalStateDictConsumer, which writes <run_dir>/hf/ as at the end of training; that
// directory is then renamed to --output. Nothing is left behind on failure.
#include "export_cli.hpp"
#include "command_line.hpp"
#include "commands.hpp"
#include "gguf_export.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainrun/core/checkpoint.hpp"
#include "trainrun/core/config.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/safetensors.hpp"
#include "trainrun/interfaces.hpp"

namespace trainrun::app {

namespace fs = std::filesystem;
namespace po = boost::program_options;

namespace {

// Removes a temporary directory whatever happens.
struct TempDir {
  fs::path path;
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) fs::remove_all(path, ec);
  }
};

// The checkpoint's meta.json, which holds the job that wrote it.
nlohmann::json read_meta(const std::string& src) {
  const fs::path meta_path = fs::path(src) / "meta.json";
  if (!fs::is_regular_file(meta_path))
    throw v1::ConfigError(src + ": no meta.json (not a trainrun checkpoint)");
  nlohmann::json meta;
  try {
    std::ifstream f(meta_path);
    meta = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    throw v1::ConfigError(meta_path.string() + ": " + e.what());
  }
  if (!meta.contains("job") || !meta["job"].contains("toml") || !meta["job"]["toml"].is_string())
    throw v1::ConfigError(meta_path.string() +
                          ": no job.toml in the checkpoint's meta (written by an older trainrun?)");
  return meta;
}

// "272 tensors (211 2-D weights in q4_1, the others f32) as GGUF (llama, 85975840 bytes)".
std::string describe(const GgufExportSummary& s, const std::string& type) {
  std::string out = std::to_string(s.tensors) + " tensors (";
  if (type == "f32") {
    out += "all f32";
  } else {
    out += std::to_string(s.in_type) + " 2-D weights in " + type;
    if (!s.output_q8_0.empty()) out += ", " + s.output_q8_0 + " (the output layer) in q8_0";
    if (s.fell_back > 0)
      out += ", " + std::to_string(s.fell_back) + " in f16 (rows not a multiple of 32)";
    out += ", the others f32";
  }
  return out + ") as GGUF (" + s.architecture + ", " + std::to_string(s.bytes) + " bytes)";
}

}  // namespace

int run_export_command(int argc, char** argv) {
  std::string output, dtype = "auto", max_shard = "5GB", format = "hf", gguf_type = "f16",
                      tokenizer_pre, gguf_name;
  std::vector<std::string> positional, plugin_paths;
  po::options_description opts("trainrun export options");
  opts.add_options()("help,h", "show this help")(
      "output,o", po::value(&output),
      "HF model directory to write (must not exist or be empty), or with --format gguf the "
      ".gguf file (must not exist)")("format", po::value(&format),
                                     "hf (default) or gguf (llama.cpp, Ollama, LM Studio; the "
                                     "default for an --output ending in .gguf)")(
      "type", po::value(&gguf_type),
      "--format gguf: the weights' type: f32, f16 (default), bf16, q8_0, q4_0, q4_1 (norms and "
      "biases stay f32)")(
      "tokenizer-pre", po::value(&tokenizer_pre),
      "--format gguf: llama.cpp's pre-tokenizer name (tokenizer.ggml.pre) when tokenizer.json's "
      "is not one the export recognises")(
      "name", po::value(&gguf_name), "--format gguf: general.name (default: the directory's name)")(
      "dtype", po::value(&dtype),
      "weights' dtype: auto (as trained: the input model's), float32, bfloat16, float16")(
      "max-shard-size", po::value(&max_shard),
      "largest weight file before sharding, as transformers' "
      "max_shard_size (default 5GB)")("plugin-path", po::value(&plugin_paths)->composing(),
                                      "plugin directory or file, searched first (repeatable)");
  po::variables_map vm;
  auto bad = [](const std::string& m) {
    std::cerr << "trainrun export: error: " << m << std::endl;
    return 2;
  };
  if (const auto done = parse_command_line(
          argc, argv, "export",
          "usage: trainrun export CHECKPOINT --output DIR [--dtype auto|float32|bfloat16|float16] "
          "[--max-shard-size 5GB]\n"
          "       trainrun export CHECKPOINT|HF_DIR --format gguf --output FILE.gguf "
          "[--type f16|f32|bf16|q8_0|q4_0|q4_1]\n"
          "Writes a Hugging Face model directory (config.json, generation_config.json, "
          "model.safetensors or shards + model.safetensors.index.json, tokenizer files) from a "
          "checkpoint of any world size. CHECKPOINT: a checkpoint directory, a checkpoints "
          "directory or its `latest` file. With --format gguf: one GGUF v3 file (weights, "
          "architecture keys, tokenizer and chat template) from a checkpoint or an HF model "
          "directory (merge a LoRA adapter first with `trainrun merge-lora`).",
          opts, vm, &positional))
    return *done;
  if (positional.size() != 1) return bad("give one CHECKPOINT (see --help)");
  std::transform(format.begin(), format.end(), format.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // A .gguf output names the format; GGUF's options name it too, and are errors with hf.
  if (!vm.count("format") && output.size() > 5 && output.substr(output.size() - 5) == ".gguf")
    format = "gguf";
  if (format == "hf")
    for (const char* k : {"type", "tokenizer-pre", "name"})
      if (vm.count(k))
        return bad(std::string("--") + k +
                   " is an option of --format gguf (this export writes an HF directory)");
  if (format == "gguf")
    for (const char* k : {"dtype", "max-shard-size"})
      if (vm.count(k))
        return bad(std::string("--") + k +
                   " is an option of the HF export; --format gguf takes --type");
  if (output.empty())
    return bad(format == "gguf" ? "--output FILE.gguf is required" : "--output DIR is required");
  if (format != "hf" && format != "gguf") return bad("--format '" + format + "': give hf or gguf");
  if (dtype != "auto" && dtype != "float32" && dtype != "bfloat16" && dtype != "float16")
    return bad("--dtype '" + dtype + "': give auto, float32, bfloat16 or float16");
  std::error_code ec;
  GgufExportOptions gguf;
  if (format == "gguf") {
    try {
      gguf.type = parse_gguf_type(gguf_type);
    } catch (const v1::Error& e) {
      return bad(e.what());
    }
    gguf.tokenizer_pre = tokenizer_pre;
    gguf.name = gguf_name;
    if (fs::exists(output, ec)) return bad("--output " + output + " exists; nothing written");
  } else if (fs::exists(output, ec) &&
             !(fs::is_directory(output, ec) && fs::is_empty(output, ec))) {
    return bad("--output " + output + " exists and is not an empty directory; nothing written");
  }
  if (!fs::exists(positional[0], ec))
    return bad(positional[0] + (format == "gguf" ? ": no such checkpoint or HF model directory"
                                                 : ": no such checkpoint directory"));
  try {
    // An HF model directory goes straight to GGUF; a checkpoint through an HF directory first.
    if (format == "gguf" && fs::is_regular_file(fs::path(positional[0]) / "config.json", ec)) {
      const GgufExportSummary s = write_gguf(positional[0], output, gguf);
      std::cout << "exported " << describe(s, gguf_type) << " of " << positional[0] << " into "
                << output << std::endl;
      return 0;
    }
    const std::string src = checkpoint_of(positional[0]);
    if (format == "gguf" && !fs::is_regular_file(fs::path(src) / "meta.json", ec))
      return bad(positional[0] +
                 ": neither a Hugging Face model directory (no config.json) nor a "
                 "trainrun checkpoint (no meta.json)");
    const nlohmann::json meta = read_meta(src);

    // Work beside the output so the final rename stays on one file system.
    const fs::path out = fs::absolute(output).lexically_normal();
    if (format == "gguf") dtype = "float32";  // the GGUF types are made from the full values
    fs::create_directories(out.parent_path());
    TempDir tmp{out.parent_path() / (out.filename().string() + ".export-tmp")};
    fs::remove_all(tmp.path, ec);
    fs::create_directories(tmp.path);

    const fs::path job_file = tmp.path / "job.toml";
    {
      std::ofstream f(job_file);
      f << meta["job"]["toml"].get<std::string>();
      if (!f) throw v1::Error("cannot write " + job_file.string());
    }
    core::JobFile jf = core::JobFile::load(job_file.string(), {});
    std::vector<std::string> paths = plugin_paths;
    for (const auto& p : jf.plugin_paths()) paths.push_back(p);
    core::Registry reg;
    reg.load_search_path(core::Registry::search_path(paths, {}));
    const core::JobConfig job = jf.validate(reg);

    const int64_t n = core::consolidate_checkpoint(src, (tmp.path / "weights").string(), 0);
    std::vector<v1::NamedTensor> state = core::read_safetensors((tmp.path / "weights" / "model.safetensors").string(), nullptr);

    std::map<std::string, v1::OptionValue> values = job.model.options.values();
    const std::string label = core::describe_component(*job.model.info);
    for (const char* k : {"save_hf", "save_dtype", "max_shard_size"})
      if (!values.count(k))
        return bad(label + " (the checkpoint's [model]) has no option '" + k +
                   "': it does not write Hugging Face model directories");
    values["save_hf"] = true;
    values["save_dtype"] = dtype;
    values["max_shard_size"] = max_shard;
    v1::RunContext ctx;
    ctx.run_dir = tmp.path.string();
    ctx.job_file = job_file.string();
    ctx.data.task = "language_modeling";
    for (const auto& t : state)  // an inline config whose vocab_size came from the dataset
      if (t.name == "model.embed_tokens.weight" && t.tensor.dim() == 2) ctx.data.vocab_size = t.tensor.size(0);
    std::unique_ptr<v1::Model> model =
        reg.create<v1::Model>(*job.model.info, v1::Options(values, "trainrun export: [model] of " + src), ctx);
    auto* consumer = dynamic_cast<v1::FinalStateDictConsumer*>(model.get());
    if (consumer == nullptr)
      return bad(label + " does not write Hugging Face model directories (no FinalStateDictConsumer)");
    core::guarded(label, "on_final_state_dict", [&] { consumer->on_final_state_dict(state); return 0; });
    if (!fs::is_regular_file(tmp.path / "hf" / "config.json"))
      return bad(label + " wrote no HF directory for " + src +
                 " (see its message above: a LoRA checkpoint's adapters are merged by `trainrun "
                 "merge-lora`, from the run's adapter/ directory)");
    if (format == "gguf") {
      if (gguf.name.empty()) gguf.name = out.stem().string();
      const GgufExportSummary s = write_gguf((tmp.path / "hf").string(), out.string(), gguf);
      std::cout << "exported " << describe(s, gguf_type) << " of checkpoint " << src << " into "
                << out.string() << std::endl;
      return 0;
    }
    if (fs::exists(out)) fs::remove(out);  // empty, checked above
    fs::rename(tmp.path / "hf", out);
    std::cout << "exported " << n << " tensors from " << src << " into " << out.string() << std::endl;
    return 0;
  } catch (const v1::Error& e) {
    return bad(e.what());
  } catch (const std::exception& e) {
    std::cerr << "trainrun export: error: " << e.what() << std::endl;
    return 1;
  }
}

}  // namespace trainrun::app
