#pragma once
// Plugin discovery and loading (Boost.DLL), ABI checks, and guarded component creation.
#include <c10/util/Exception.h>
#include <trainrun/plugin.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace trainrun::core {

using v1::ComponentKind;

/// A component offered by a loaded plugin.
struct ComponentInfo {
  ComponentKind kind;
  std::string name;
  std::string summary;
  std::string plugin_name;
  std::string plugin_version;
  std::string file;
  v1::OptionSchema schema;
  const trainrun_component_v1* descriptor = nullptr;
};

/// A plugin that loaded and passed every check.
struct PluginInfo {
  std::string name;
  std::string version;
  std::string file;
  uint32_t abi_major = 0, abi_minor = 0;
  std::string torch_version;
  std::string compiler_id;
  std::vector<std::string> components;  // "kind/name"
};

/// A file that was found but not loaded, with the reason, and the components it declared when
/// its descriptor could be read (so a job naming one gets that reason).
struct SkippedPlugin {
  std::string file;
  std::string reason;
  std::vector<std::pair<ComponentKind, std::string>> components;
};

class Registry {
 public:
  /// Loads every plugin on the search path. Entries are directories (every *.so inside is
  /// tried, in name order; failures become warnings) or files (loaded explicitly; a failure
  /// throws PluginError). The first plugin of a given name wins; later ones are reported.
  void load_search_path(const std::vector<std::string>& entries);

  /// Loads one plugin file. Throws PluginError naming the file when it fails a check.
  void load_file(const std::string& file);

  /// nullptr when no loaded plugin offers it.
  const ComponentInfo* find(ComponentKind kind, const std::string& name) const;

  /// Like find(), but throws ConfigError listing the found components of that kind, and the
  /// reason when a skipped plugin declared this component.
  const ComponentInfo& require(ComponentKind kind, const std::string& name,
                               const std::string& where) const;

  std::vector<const ComponentInfo*> components(ComponentKind kind) const;
  std::vector<const ComponentInfo*> all_components() const;
  const std::vector<PluginInfo>& plugins() const { return plugins_; }
  const std::vector<SkippedPlugin>& skipped() const { return skipped_; }
  const std::vector<std::string>& warnings() const { return warnings_; }

  /// Creates a component. Any exception from the plugin's factory becomes a PluginError that
  /// names the plugin, its file and the component.
  template <class Interface>
  std::unique_ptr<Interface> create(const ComponentInfo& info, const v1::Options& options,
                                    const v1::RunContext& ctx) const {
    return std::unique_ptr<Interface>(static_cast<Interface*>(create_raw(info, options, ctx)));
  }

  /// The plugin search path in effect: --plugin-path, [plugins] path, TRAINRUN_PLUGIN_PATH,
  /// the install's plugin directory.
  static std::vector<std::string> search_path(const std::vector<std::string>& cli,
                                              const std::vector<std::string>& job);
  /// <dir of the trainrun executable>/../lib/trainrun/plugins
  static std::string install_plugin_dir();

 private:
  void* create_raw(const ComponentInfo& info, const v1::Options& options,
                   const v1::RunContext& ctx) const;
  void load(const std::string& file, bool explicit_file);

  std::vector<PluginInfo> plugins_;
  std::vector<std::unique_ptr<ComponentInfo>> components_;
  std::vector<SkippedPlugin> skipped_;
  std::vector<std::string> warnings_;
  std::vector<std::string> searched_;  // search-path entries, for "unknown plugin" errors
};

/// Label used in guarded-call errors: "model 'gpt' (plugin models, /path/libtrainrun-models.so)".
std::string describe_component(const ComponentInfo& info);

/// Runs fn(); an exception escaping it is rethrown as PluginError prefixed with `label` and the
/// operation, so every error from inside a plugin names that plugin.
template <class F>
auto guarded(const std::string& label, const char* operation, F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const v1::PluginError&) {
    throw;
  } catch (const c10::Error& e) {
    throw v1::PluginError(label + ": " + operation + " failed: " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw v1::PluginError(label + ": " + operation + " failed: " + e.what());
  } catch (...) {
    throw v1::PluginError(label + ": " + operation +
                          " failed: threw an exception that is not a std::exception");
  }
}

}  // namespace trainrun::core
