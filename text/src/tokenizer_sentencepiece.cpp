// A directory with only tokenizer.model (no tokenizer.json): loads the sentencepiece module
// (text/sentencepiece/, libtrainrun_text_sentencepiece.so beside this library) on first use.
// Why a module and RTLD_DEEPBIND: see that file.
#include "tokenizer_internal.hpp"

#include <dlfcn.h>

#include <filesystem>
#include <mutex>

namespace trainrun::text {

namespace {
// ASan and TSan refuse RTLD_DEEPBIND (a deep-bound library would call libc's malloc and pthread
// functions past their interceptors) and stop the process. Sanitizer builds (scripts/sanitize)
// load the module plainly: fine where LibTorch's libprotobuf is not in the process (the text
// units), so there they cover the module; trainrun itself reading a tokenizer.model-only
// directory is not run under sanitizers.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kDeepBind = 0;
#else
constexpr int kDeepBind = RTLD_DEEPBIND;
#endif

using LoadFn = TokenizerImpl* (*)(const std::string&, const nlohmann::json&, std::string&);

LoadFn module_entry(const std::string& model_file) {
  static std::mutex m;
  static LoadFn fn = nullptr;
  std::lock_guard<std::mutex> lock(m);
  if (fn) return fn;
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&load_sentencepiece_tokenizer), &info) || !info.dli_fname)
    throw v1::ConfigError(model_file + ": cannot locate libtrainrun_text to find the sentencepiece module");
  const std::string path =
      (std::filesystem::path(info.dli_fname).parent_path() / "libtrainrun_text_sentencepiece.so").string();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | kDeepBind);
  if (!handle)
    throw v1::ConfigError(model_file + ": reading SentencePiece models needs " + path + " (built where " +
                          "libsentencepiece-dev is installed): " + dlerror() +
                          "; or write a tokenizer.json with transformers' save_pretrained");
  fn = reinterpret_cast<LoadFn>(dlsym(handle, "trainrun_text_sentencepiece_load"));
  if (!fn) throw v1::ConfigError(path + ": no trainrun_text_sentencepiece_load");
  return fn;  // never unloaded: tokenizers made by it may live until exit
}
}  // namespace

std::shared_ptr<TokenizerImpl> load_sentencepiece_tokenizer(const std::string& dir, const nlohmann::json& config) {
  const std::string file = (std::filesystem::path(dir) / "tokenizer.model").string();
  std::string error;
  TokenizerImpl* impl = module_entry(file)(dir, config, error);
  if (!impl) throw v1::ConfigError(error);
  return std::shared_ptr<TokenizerImpl>(impl);
}

}  // namespace trainrun::text
