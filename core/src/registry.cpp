// Plugin loader. Follows the order of checks in docs/design.md ("The plugin ABI"): the entry symbol
// is looked up in the ELF symbol table before the library is loaded (no plugin code runs for a
// file that is not a plugin), then the descriptor's ABI, LibTorch version, C++ ABI and LibTorch
// identity are checked before any component is registered.
#include "trainrun/core/registry.hpp"

#include <torch/version.h>

#include <boost/dll/library_info.hpp>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "trainrun/core/spelling.hpp"
#include "trainrun/core/log.hpp"

namespace fs = std::filesystem;

namespace trainrun::core {
namespace {

using v1::PluginError;

// Libraries are never unloaded (docs/design.md): objects and exceptions created by a plugin may
// live until exit, so the handles are leaked on purpose.
std::vector<boost::dll::shared_library>& loaded_libraries() {
  static auto* libs = new std::vector<boost::dll::shared_library>();
  return *libs;
}

std::string abi_string(uint32_t major, uint32_t minor) {
  return std::to_string(major) + "." + std::to_string(minor);
}

// 8: Objective (ABI 1.8), 9: Reward (ABI 1.10).
bool valid_kind(uint32_t k) { return k >= 1 && k <= 9; }

}  // namespace

std::string describe_component(const ComponentInfo& info) {
  return std::string(v1::kind_name(info.kind)) + " '" + info.name + "' (plugin " +
         info.plugin_name + ", " + info.file + ")";
}

std::string Registry::install_plugin_dir() {
  fs::path exe = boost::dll::program_location();
  return (exe.parent_path().parent_path() / "lib" / "trainrun" / "plugins").string();
}

std::vector<std::string> Registry::search_path(const std::vector<std::string>& cli,
                                               const std::vector<std::string>& job) {
  std::vector<std::string> out(cli.begin(), cli.end());
  out.insert(out.end(), job.begin(), job.end());
  if (const char* env = std::getenv("TRAINRUN_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) out.push_back(item);
  }
  out.push_back(install_plugin_dir());
  return out;
}

void Registry::load_search_path(const std::vector<std::string>& entries) {
  for (const auto& entry : entries) {
    searched_.push_back(entry);
    std::error_code ec;
    if (fs::is_directory(entry, ec)) {
      std::vector<fs::path> files;
      for (const auto& de : fs::directory_iterator(entry, ec))
        if (de.path().extension() == ".so" && (de.is_regular_file() || de.is_symlink()))
          files.push_back(de.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) load(f.string(), false);
    } else if (fs::exists(entry, ec)) {
      load(entry, true);
    } else {
      warnings_.push_back("plugin path entry '" + entry + "' does not exist");
    }
  }
}

namespace {
// Step 1 of Registry::load: whether `file` exports the entry symbol, read from its ELF tables
// without loading (or running) it. Returns why it is not a plugin, or "" when it may be one.
std::string probe_entry_symbol(const std::string& file) {
  {
    std::ifstream f(file, std::ios::binary);
    char magic[4] = {};
    if (!f.read(magic, sizeof(magic)) || std::memcmp(magic, "\x7f" "ELF", 4) != 0) {
      std::error_code ec;
      const auto size = fs::file_size(file, ec);
      return "not a loadable shared object: not an ELF file (" +
             (ec ? std::string("unreadable") : std::to_string(size) + " bytes") + ")";
    }
  }
  bool has_entry = false;
  try {
    boost::dll::library_info info(fs::path(file), /*throw_if_not_native=*/true);
    auto symbols = info.symbols();
    has_entry =
        std::find(symbols.begin(), symbols.end(), TRAINRUN_PLUGIN_ENTRY_NAME) != symbols.end();
  } catch (const std::exception& e) {
    return std::string("not a loadable shared object: truncated or corrupt ELF file (") +
           e.what() + ")";
  }
  if (!has_entry)
    return std::string("not a trainrun plugin: it exports no '") + TRAINRUN_PLUGIN_ENTRY_NAME +
           "' symbol";
  return "";
}

// Step 2 of Registry::load: load `file` and call its entry point. Returns the descriptor, or
// nullptr with the reason in `why`.
const trainrun_plugin_descriptor_v1* open_plugin(boost::dll::shared_library& lib,
                                                 const std::string& file, std::string& why) {
  auto refuse = [](std::string& out, std::string reason) -> const trainrun_plugin_descriptor_v1* {
    out = std::move(reason);
    return nullptr;
  };
  // RTLD_LOCAL keeps each plugin's symbols to itself; RTLD_NOW reports a missing
  // dependency here rather than at the first call. LibTorch 2.x (the PyPI wheel) carries its own
  // Gloo and exports its symbols: without RTLD_DEEPBIND a plugin linking the system's libgloo
  // (gloo-cpu, cuda) would have its Gloo calls bound to LibTorch's copy, of another version,
  // and crash. DEEPBIND makes a plugin and the libraries it brings resolve among themselves
  // first; LibTorch itself is the copy already loaded either way.
  auto mode = boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local;
#if TORCH_VERSION_MAJOR >= 2
  mode = mode | boost::dll::load_mode::rtld_deepbind;
#endif
  try {
    lib.load(fs::path(file), mode);
  } catch (const std::exception& e) {
    return refuse(why, std::string("could not be loaded: ") + e.what());
  }
  if (!lib.has(TRAINRUN_PLUGIN_ENTRY_NAME))
    return refuse(why, std::string("not a trainrun plugin: no '") + TRAINRUN_PLUGIN_ENTRY_NAME +
                "' symbol after loading");
  auto entry = lib.get<const trainrun_plugin_descriptor_v1*()>(TRAINRUN_PLUGIN_ENTRY_NAME);
  const trainrun_plugin_descriptor_v1* d = nullptr;
  try {
    d = entry();
  } catch (const std::exception& e) {
    return refuse(why, std::string("entry point threw: ") + e.what());
  } catch (...) {
    return refuse(why, "entry point threw an exception that is not a std::exception");
  }
  if (!d) why = "entry point returned no descriptor";
  return d;
}

// Step 3 of Registry::load, once the major matched and the component list is readable: a newer
// minor, another LibTorch, another C++ ABI, another copy of LibTorch. "" when none.
std::string build_mismatch(const trainrun_plugin_descriptor_v1& d, const std::string& abi_mismatch) {
  if (d.abi_minor > v1::kAbiMinor) return abi_mismatch;
  const std::string torch_version = d.torch_version ? d.torch_version : "(none)";
  if (torch_version != TRAINRUN_BUILD_TORCH_VERSION)
    return "built for LibTorch " + torch_version + ", this trainrun uses LibTorch " +
           TRAINRUN_BUILD_TORCH_VERSION;
  if (d.cxx11_abi != _GLIBCXX_USE_CXX11_ABI)
    return "built with _GLIBCXX_USE_CXX11_ABI=" + std::to_string(d.cxx11_abi) +
           ", this trainrun uses _GLIBCXX_USE_CXX11_ABI=" + std::to_string(_GLIBCXX_USE_CXX11_ABI);
  if (d.torch_anchor != reinterpret_cast<const void*>(&c10::GetCPUAllocator))
    return "resolves LibTorch to a different copy than this trainrun (two LibTorch "
           "libraries in one process); rebuild it against the same LibTorch";
  return "";
}

std::unique_ptr<ComponentInfo> component_info(const trainrun_component_v1& c,
                                              const PluginInfo& plugin, const std::string& file) {
  auto info = std::make_unique<ComponentInfo>();
  info->kind = static_cast<ComponentKind>(c.kind);
  info->name = c.name;
  info->summary = c.summary ? c.summary : "";
  info->plugin_name = plugin.name;
  info->plugin_version = plugin.version;
  info->file = file;
  info->descriptor = &c;
  return info;
}
}  // namespace

void Registry::load_file(const std::string& file) { load(file, true); }

void Registry::load(const std::string& file_in, bool explicit_file) {
  const std::string file = fs::absolute(file_in).lexically_normal().string();
  for (const auto& p : plugins_)
    if (p.file == file) return;  // the same file reached twice through the path

  SkippedPlugin skip{file, {}, {}};
  // Declared before `fail` so a library whose code has run (static initializers, the entry
  // point) stays loaded even when it is refused: libraries are never unloaded (docs/design.md).
  boost::dll::shared_library lib;
  auto fail = [&](const std::string& reason) {
    if (lib.is_loaded()) loaded_libraries().push_back(std::move(lib));
    skip.reason = reason;
    std::string msg = "plugin " + file + ": " + reason;
    if (explicit_file) throw PluginError(msg);
    warnings_.push_back(msg + " (skipped)");
    skipped_.push_back(skip);
  };

  // 1. The entry symbol, read from the ELF tables without loading (or running) the file.
  if (const std::string why = probe_entry_symbol(file); !why.empty()) return fail(why);

  // 2. Load, and ask the entry point for the descriptor.
  std::string why;
  const trainrun_plugin_descriptor_v1* d = open_plugin(lib, file, why);
  if (!d) return fail(why);

  // 3. Descriptor checks, in docs/design.md's order. Only struct_size, abi_major and abi_minor are
  // common to every ABI major: nothing after them is read before the major matches.
  const std::string abi_mismatch = "built for ABI " + abi_string(d->abi_major, d->abi_minor) +
                                   ", this trainrun supports ABI " +
                                   abi_string(v1::kAbiMajor, v1::kAbiMinor) +
                                   " (major must match, minor must not be newer)";
  if (d->abi_major != v1::kAbiMajor) return fail(abi_mismatch);
  constexpr size_t kMinSize = offsetof(trainrun_plugin_descriptor_v1, components) + sizeof(void*);
  if (d->struct_size < kMinSize)
    return fail("descriptor is " + std::to_string(d->struct_size) + " bytes, at least " +
                std::to_string(kMinSize) + " expected");
  // Same major: fields are only appended, so the component list can be read. Remember what it
  // declared so a job that names one of its components gets the reason it was refused.
  auto remember_components = [&] {
    if (!d->components) return;
    for (uint32_t i = 0; i < d->num_components; ++i)
      if (valid_kind(d->components[i].kind) && d->components[i].name)
        skip.components.emplace_back(static_cast<ComponentKind>(d->components[i].kind),
                                     d->components[i].name);
  };
  if (const std::string mismatch = build_mismatch(*d, abi_mismatch); !mismatch.empty()) {
    remember_components();
    return fail(mismatch);
  }
  const std::string torch_version = d->torch_version ? d->torch_version : "(none)";
  const std::string name = d->plugin_name ? d->plugin_name : "";
  if (name.empty()) return fail("descriptor has no plugin name");
  for (const auto& p : plugins_)
    if (p.name == name) {
      warnings_.push_back("plugin '" + name + "' found twice: using " + p.file + ", ignoring " +
                          file);
      loaded_libraries().push_back(std::move(lib));  // its code has run: never unloaded
      return;
    }
  if (d->num_components > 0 && !d->components) return fail("descriptor lists no components");

  PluginInfo pinfo{name,
                   d->plugin_version ? d->plugin_version : "",
                   file,
                   d->abi_major,
                   d->abi_minor,
                   torch_version,
                   d->compiler_id ? d->compiler_id : "",
                   {}};
  std::vector<std::unique_ptr<ComponentInfo>> added;
  for (uint32_t i = 0; i < d->num_components; ++i) {
    const auto& c = d->components[i];
    if (c.struct_size < sizeof(trainrun_component_v1) || !valid_kind(c.kind) || !c.name ||
        !c.create || !c.declare_options)
      return fail("component #" + std::to_string(i) + " has a malformed descriptor");
    auto kind = static_cast<ComponentKind>(c.kind);
    if (const ComponentInfo* other = find(kind, c.name)) {
      warnings_.push_back(std::string(v1::kind_name(kind)) + " '" + c.name + "' offered twice: using " +
                          other->file + ", ignoring the one in " + file);
      continue;
    }
    auto info = component_info(c, pinfo, file);
    try {
      c.declare_options(&info->schema);
    } catch (const std::exception& e) {
      return fail(std::string("component '") + c.name + "' failed to declare its options: " +
                  e.what());
    }
    pinfo.components.push_back(std::string(v1::kind_name(kind)) + "/" + c.name);
    added.push_back(std::move(info));
  }
  for (auto& a : added) components_.push_back(std::move(a));
  plugins_.push_back(std::move(pinfo));
  loaded_libraries().push_back(std::move(lib));
}

const ComponentInfo* Registry::find(ComponentKind kind, const std::string& name) const {
  for (const auto& c : components_)
    if (c->kind == kind && c->name == name) return c.get();
  return nullptr;
}

const ComponentInfo& Registry::require(ComponentKind kind, const std::string& name,
                                       const std::string& where) const {
  if (const ComponentInfo* c = find(kind, name)) return *c;
  for (const auto& s : skipped_)
    for (const auto& [k, n] : s.components)
      if (k == kind && n == name)
        throw PluginError(where + ": " + v1::kind_name(kind) + " plugin '" + name +
                          "' cannot be used: plugin " + s.file + ": " + s.reason);
  std::string found;
  std::vector<std::string> names;
  for (const auto* c : components(kind)) {
    found += (found.empty() ? "" : ", ") + c->name;
    names.push_back(c->name);
  }
  const std::string hint = closest(name, names);
  std::string msg = where + ": unknown " + v1::kind_name(kind) + " plugin '" + name + "'" +
                    (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                    "; found: " + (found.empty() ? "(none)" : found);
  std::string searched;
  for (const auto& e : searched_) searched += (searched.empty() ? "" : ", ") + e;
  msg += "; searched: " + (searched.empty() ? std::string("(nothing)") : searched) +
         " (add directories with --plugin-path, [plugins] path or TRAINRUN_PLUGIN_PATH)";
  if (!skipped_.empty()) {
    msg += "; skipped plugin files:";
    for (const auto& s : skipped_) msg += "\n  " + s.file + ": " + s.reason;
  }
  throw v1::ConfigError(msg);
}

std::vector<const ComponentInfo*> Registry::components(ComponentKind kind) const {
  std::vector<const ComponentInfo*> out;
  for (const auto& c : components_)
    if (c->kind == kind) out.push_back(c.get());
  return out;
}

std::vector<const ComponentInfo*> Registry::all_components() const {
  std::vector<const ComponentInfo*> out;
  for (const auto& c : components_) out.push_back(c.get());
  return out;
}

void* Registry::create_raw(const ComponentInfo& info, const v1::Options& options,
                           const v1::RunContext& ctx) const {
  void* obj = guarded(describe_component(info), "create", [&] {
    return info.descriptor->create(&options, &ctx);
  });
  if (!obj) throw PluginError(describe_component(info) + ": factory returned null");
  return obj;
}

}  // namespace trainrun::core
