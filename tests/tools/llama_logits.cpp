// llama_logits: trainrun's llama logits for given token ids, for the tests that compare them with
// transformers and PEFT (tests/e2e/llama_e2e.py). Built from the plugin's own sources, as the unit
// tests are.
//
//   llama_logits MODEL_DIR IDS.safetensors OUT.safetensors [ADAPTER_DIR] [--bf16] [--kv-cache]
//
// IDS holds "input_ids" int64 [B, T]; OUT gets "logits" float32 [B, T, V]. With ADAPTER_DIR (PEFT
// layout: adapter_config.json + adapter_model.safetensors) each adapted layer gets a LoRA adapter
// of the lora plugin loaded with those weights. --bf16 casts the model to bfloat16 first (the
// `bf16-true` precision's compute). --kv-cache computes them through the KV-cache decoder instead
// (v1::IncrementalDecoder): the first half of the tokens as one prefill, then one token per call.
// --padded does the same through v1::PaddedDecoder with row b cut to its first T - 2b tokens and
// left-padded back to T (pad id 0, masked): logits[b, t] for t < T - 2b, zeros after.
// Exit 2 on bad input, with the reason.
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "models/llama/llama.hpp"
#include "callbacks/lora/lora.hpp"
#include "trainrun/hf/safetensors.hpp"
#include "trainrun/model/linear.hpp"

namespace fs = std::filesystem;
using namespace trainrun;

namespace {

void add_adapters(llama::LlamaModel& model, const std::string& dir) {
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(fs::path(dir) / "adapter_config.json"));
  const int64_t r = cfg.at("r").get<int64_t>();
  const double alpha = cfg.at("lora_alpha").get<double>();
  const bool rslora = cfg.value("use_rslora", false);
  std::map<std::string, at::Tensor> w;
  for (auto& t : hf::read_safetensors((fs::path(dir) / "adapter_model.safetensors").string())) w[t.name] = t.tensor;
  const std::string prefix = "base_model.model.";
  std::vector<std::string> layers;
  for (const auto& [name, t] : w)
    if (name.size() > 14 && name.compare(name.size() - 14, 14, ".lora_A.weight") == 0)
      layers.push_back(name.substr(prefix.size(), name.size() - prefix.size() - 14));
  torch::NoGradGuard no_grad;
  for (const auto& [name, layer] : v1::find_linear_layers(model, layers, {}, "llama_logits")) {
    if (std::find(layers.begin(), layers.end(), name) == layers.end()) continue;  // suffix match only
    auto a = std::make_shared<lora::LoraAdapter>(layer->options.in_features(), layer->options.out_features(), r,
                                                 alpha, 0.0, rslora);
    a->A().detach().copy_(w.at(prefix + name + ".lora_A.weight"));
    a->B().detach().copy_(w.at(prefix + name + ".lora_B.weight"));
    layer->add_adapter(a);
  }
  // Trained biases (bias = "all" / "lora_only") replace the base's.
  for (auto& p : model.named_parameters())
    if (auto it = w.find(prefix + p.name); it != w.end()) p.tensor.detach().copy_(it->second);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  bool bf16 = false, kv_cache = false, padded = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--bf16") bf16 = true;
    else if (std::string(argv[i]) == "--kv-cache") kv_cache = true;
    else if (std::string(argv[i]) == "--padded")
      padded = true;
    else args.push_back(argv[i]);
  }
  if (args.size() < 3 || args.size() > 4) {
    std::cerr << "usage: llama_logits MODEL_DIR IDS.safetensors OUT.safetensors [ADAPTER_DIR] "
                 "[--bf16] [--kv-cache | --padded]\n";
    return 2;
  }
  try {
    at::set_num_threads(1);
    llama::LlamaModel model(args[0]);
    if (args.size() == 4) add_adapters(model, args[3]);
    model.train(false);
    if (bf16) model.module()->to(at::kBFloat16);
    at::Tensor ids;
    for (auto& t : hf::read_safetensors(args[1]))
      if (t.name == "input_ids") ids = t.tensor.to(at::kLong);
    if (!ids.defined()) throw v1::ConfigError(args[1] + ": no tensor 'input_ids'");
    torch::NoGradGuard no_grad;
    at::Tensor logits;
    if (padded) {
      const int64_t B = ids.size(0), T = ids.size(1), prefill = std::max<int64_t>(1, T / 2);
      if (T - 2 * (B - 1) < 1) throw v1::ConfigError("--padded needs T > 2 (B - 1)");
      at::Tensor in = at::zeros_like(ids), mask = at::zeros_like(ids);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t n = T - 2 * b;
        in[b].narrow(0, T - n, n).copy_(ids[b].narrow(0, 0, n));
        mask[b].narrow(0, T - n, n).fill_(1);
      }
      auto state = model.new_decode_state(B, T);
      std::vector<at::Tensor> parts = {
          model.decode_padded(in.narrow(1, 0, prefill), mask.narrow(1, 0, prefill), *state)};
      for (int64_t t = prefill; t < T; ++t)
        parts.push_back(model.decode_padded(in.narrow(1, t, 1), mask.narrow(1, 0, t + 1), *state));
      const at::Tensor all = at::cat(parts, 1);
      logits = at::zeros_like(all);
      for (int64_t b = 0; b < B; ++b)
        logits[b].narrow(0, 0, T - 2 * b).copy_(all[b].narrow(0, 2 * b, T - 2 * b));
    } else if (kv_cache) {
      const int64_t T = ids.size(1), prefill = std::max<int64_t>(1, T / 2);
      auto state = model.new_decode_state(ids.size(0), T);
      std::vector<at::Tensor> parts = {model.decode(ids.narrow(1, 0, prefill), *state)};
      for (int64_t t = prefill; t < T; ++t) parts.push_back(model.decode(ids.narrow(1, t, 1), *state));
      logits = at::cat(parts, 1);
    } else {
      logits = model.logits(ids).to(at::kFloat);
    }
    hf::write_safetensors(args[2], {{"logits", logits}}, {{"format", "pt"}});
    std::cout << model.describe() << ": logits " << logits.sizes() << " -> " << args[2] << "\n";
    return 0;
  } catch (const v1::ConfigError& e) {
    std::cerr << "llama_logits: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "llama_logits: error: " << e.what() << "\n";
    return 1;
  }
}
