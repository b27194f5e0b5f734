// Job-file validation. Every table is checked against a schema (the core's for [trainer],
// [launch], [plugins]; the chosen plugin's for the others) before any component is created, so
// a typo on line 40 is reported before a ten-minute data load, with the file, line, column and
// key named.
#include "trainrun/core/config.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/runtime.hpp"
#include "trainrun/core/spelling.hpp"

// The resolved job prints floats as the shortest text that reads back to the same double
// (lr = 0.05), not max_digits10 (lr = 0.050000000000000003): toml++ 3.3 does that only with
// TOML_FLOAT_CHARCONV, which it turns off on every GCC (written before GCC 11 had it), and
// Debian's toml++ is a shared library built that way. So this file, the only one that includes
// toml++, compiles it header-only with the flag on (the package's own headers, same version).
#undef TOML_HEADER_ONLY
#define TOML_HEADER_ONLY 1
#undef TOML_SHARED_LIB
#undef TOML_FLOAT_CHARCONV
#define TOML_FLOAT_CHARCONV 1
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

namespace trainrun::core {

using v1::ConfigError;
using v1::OptionSpec;
using v1::OptionType;
using v1::OptionValue;

// ---------------------------------------------------------------------------------------------
// Units

namespace {
std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
}  // namespace

int64_t parse_size(const std::string& text_in) {
  const std::string text = trim(text_in);
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    throw std::invalid_argument("'" + text_in + "' is not a size (e.g. \"25MiB\", \"2GB\", 4096)");
  }
  const std::string unit = to_lower(trim(text.substr(pos)));
  static const std::map<std::string, double> units = {
      {"", 1},         {"b", 1},
      {"k", 1024.0},   {"kib", 1024.0},   {"kb", 1e3},
      {"m", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},
      {"g", 1073741824.0}, {"gib", 1073741824.0}, {"gb", 1e9},
      {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12}};
  auto it = units.find(unit);
  if (it == units.end())
    throw std::invalid_argument("'" + text_in + "' has an unknown size unit '" + unit +
                                "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  double bytes = value * it->second;
  if (!(bytes >= 0) || bytes > 9.2e18)
    throw std::invalid_argument("'" + text_in + "' is not a non-negative size");
  return static_cast<int64_t>(std::llround(bytes));
}

double parse_duration(const std::string& text_in) {
  std::string text = to_lower(trim(text_in));
  if (text.empty()) throw std::invalid_argument("empty duration");
  static const std::map<std::string, double> units = {
      {"ms", 1e-3}, {"s", 1}, {"sec", 1}, {"m", 60}, {"min", 60}, {"h", 3600}, {"d", 86400}};
  double total = 0;
  size_t i = 0;
  while (i < text.size()) {
    size_t pos = 0;
    double v = 0;
    try {
      v = std::stod(text.substr(i), &pos);
    } catch (...) {
      throw std::invalid_argument("'" + text_in +
                                  "' is not a duration (e.g. \"90s\", \"10min\", \"1h30min\", 2.5)");
    }
    i += pos;
    size_t j = i;
    while (j < text.size() && std::isalpha(static_cast<unsigned char>(text[j]))) ++j;
    std::string unit = text.substr(i, j - i);
    i = j;
    while (i < text.size() && text[i] == ' ') ++i;
    if (unit.empty()) unit = "s";
    auto it = units.find(unit);
    if (it == units.end())
      throw std::invalid_argument("'" + text_in + "' has an unknown duration unit '" + unit +
                                  "' (use ms, s, min, h, d)");
    total += v * it->second;
  }
  if (!(total >= 0)) throw std::invalid_argument("'" + text_in + "' is negative");
  return total;
}

std::string batch_layout_error(int64_t global, int64_t micro, int64_t world) {
  if (micro == 0 && global % world != 0)
    return "[trainer] global_batch_size " + std::to_string(global) +
           " is not divisible by world_size " + std::to_string(world) +
           " ([launch] nproc_per_node x nnodes)";
  if (micro > 0 && global % (micro * world) != 0)
    return "[trainer] global_batch_size " + std::to_string(global) +
           " is not divisible by micro_batch_size " + std::to_string(micro) + " x world_size " +
           std::to_string(world) + " (the gradient-accumulation step count must be a whole number; "
           "micro_batch_size = 0 derives it as global_batch_size / world_size)";
  return "";
}

std::string range_text(const OptionSpec& s) {
  auto fmt = [](double v) {
    std::ostringstream os;
    if (std::fabs(v) < 1e15 && v == std::floor(v)) os << static_cast<long long>(v);
    else os << v;
    return os.str();
  };
  return "[" + (s.min ? fmt(*s.min) : "-inf") + ", " + (s.max ? fmt(*s.max) : "inf") + "]";
}

// ---------------------------------------------------------------------------------------------
// Core schemas

v1::OptionSchema trainer_schema() {
  v1::OptionSchema s;
  s.integer("max_steps", 0, "Optimizer steps to run; 0 = use max_epochs", 0, 1e15);
  s.integer("max_epochs", 0, "Passes over the training split when max_steps = 0", 0, 1e9);
  s.integer("global_batch_size", 32,
            "Samples per optimizer step across all ranks (micro_batch_size x accumulation x "
            "world_size)", 1, 1e9);
  s.integer("micro_batch_size", 0,
            "Samples per forward/backward on one rank; 0 = global_batch_size / world_size", 0, 1e9);
  s.integer("eval_batch_size", 0, "Samples per evaluation batch; 0 = micro_batch_size", 0, 1e9);
  s.integer("seed", 0, "Seed of every random stream (same seed -> identical run on CPU)", 0,
            9.007e15);
  s.string("run_dir", "", "Output directory; \"\" = runs/<job file name>");
  s.integer("eval_every", 0, "Evaluate every N steps (and always at the end); 0 = only at the end",
            0, 1e15);
  s.integer("eval_max_batches", 0,
            "Cap on evaluation batches per rank per evaluation (as Lightning's "
            "limit_val_batches); 0 = whole split", 0, 1e15);
  s.boolean("drop_last", true,
            "End of an epoch: skip the samples that do not fill a whole global batch (true), or "
            "pad the last global batch by repeating the epoch's first samples (false)");
  s.boolean("save_final_model", true,
            "At the end, rank 0 writes the strategy's full state dict to "
            "<run_dir>/model.safetensors (atomically)");
  s.choice("state_dict_type", "full", {"full", "sharded"},
           "What save_final_model writes (PyTorch FSDP's names): \"full\" = the gathered model "
           "in <run_dir>/model.safetensors; \"sharded\" = each rank its own pieces, no gather, in "
           "<run_dir>/model-shards/rank-R-of-W.safetensors (strategies zero and fsdp)");
  s.string("init_weights", "",
           "A safetensors file (e.g. a run's model.safetensors) whose tensors replace the "
           "model's parameters and buffers of the same names before training; every name and "
           "shape must match; \"\" = the model's own initialisation");
  s.string_list("freeze", {},
                "Parameters to freeze (requires_grad off) before the strategy wraps the model: "
                "state-dict names or shell-style globs (\"blocks.0.*\", \"*.bias\"); each "
                "pattern must match at least one parameter");
  s.string("resume", "",
           "Continue from a checkpoint: \"latest\" (the checkpoints directory's `latest`), "
           "\"latest-valid\" (the newest one whose checksums verify, falling back past corrupt "
           "ones), or a step-NNNNNNN directory; \"\" = start fresh. Model, optimizer, loss "
           "scaler, step, data position and RNG are restored (bitwise-exact on CPU fp32)");
  s.integer("stop_after_steps", 0,
            "End this process once this many steps (counted from step 0) are done, saving a "
            "checkpoint when a `checkpoint` callback is listed, without final evaluation (for "
            "time-sliced or preemptible queues; the schedule still runs to max_steps); 0 = off",
            0, 1e15);
  s.integer("log_every", 10, "Log metrics every N steps", 1, 1e15);
  s.real("gradient_clip_val", 0.0,
         "Clip gradients (after unscaling): to this global L2 norm, or each element to "
         "[-value, value] (gradient_clip_algorithm); 0 = off", 0, 1e30);
  s.real("max_skipped_fraction", 0.5,
         "A run that skipped more than this fraction of its steps (non-finite loss or "
         "gradients) ends with exit code 3 and a diagnosis; a run whose weights become "
         "non-finite stops at once with exit code 3", 0, 1);
  s.choice("gradient_clip_algorithm", "norm", {"norm", "value"},
           "How gradient_clip_val clips (Lightning's names): \"norm\" scales all gradients by "
           "val / global L2 norm when the norm exceeds val (across ranks and shards); \"value\" "
           "clamps each gradient element to [-val, val]");
  s.boolean("activation_checkpointing", false,
            "Recompute each sharding unit's forward during backward instead of storing its "
            "activations (the model's units, e.g. gpt's blocks; see "
            "activation_checkpointing_units)");
  s.string_list("activation_checkpointing_units", {},
                "With activation_checkpointing = true: only these units (names as the model "
                "gives them, e.g. \"blocks.0\"); empty = every unit");
  return s;
}

v1::OptionSchema launch_schema() {
  v1::OptionSchema s;
  s.integer("nproc_per_node", 1, "Worker processes (ranks) on this node", 1, 4096);
  s.integer("nnodes", 1, "Number of nodes", 1, 65536);
  s.integer("node_rank", 0, "This node's index in [0, nnodes)", 0, 65535);
  s.string("master_addr", "127.0.0.1", "Address of node 0's rendezvous store");
  s.integer("master_port", 0,
            "Port of the rendezvous store; 0 = pick a free one (nnodes = 1 only)", 0, 65535);
  s.choice("store_listen", "master_addr", {"master_addr", "all"},
           "Where node 0's rendezvous store listens: only on master_addr (the default), or on "
           "every interface (\"all\"); the store has no authentication, so anyone who reaches "
           "its port can read and change the job's rendezvous keys");
  s.duration("rendezvous_timeout_s", 300.0,
             "How long agents and workers wait for each other to arrive", 0.1, 1e7);
  s.duration("stop_grace_s", 5.0,
             "When stopping workers: SIGTERM, then SIGKILL after this long unless the worker "
             "is writing a checkpoint (then stop_save_timeout_s applies)", 0.0, 3600.0);
  s.duration("stop_save_timeout_s", 600.0,
             "When stopping workers: a worker that is writing a checkpoint is killed only this "
             "long after its save began (keep stop_grace_s + this below the cluster's own "
             "kill delay: SLURM KillWait, Kubernetes terminationGracePeriodSeconds)", 0.0, 1e6);
  s.integer("max_restarts", 0,
            "Elastic restarts (trainrun's agent, any nnodes): when a worker fails or a node's agent "
            "is replaced, stop all workers on every node, start them again and resume from the "
            "latest checkpoint (`checkpoint` callback; a run_dir every node shares), at most this "
            "many times; 0 = a failure ends the job", 0, 1000);
  s.choice("launcher", "auto", {"auto", "trainrun", "mpiexec"},
           "How workers are started: trainrun's own agent, or MPICH's mpiexec; auto = mpiexec "
           "when [accelerator] plugin is \"mpi\", else trainrun");
  s.string("blas_coretype", "auto",
           "OpenBLAS kernel set of the ranks (OPENBLAS_CORETYPE): auto = this CPU's best where "
           "OpenBLAS picked a lower ISA tier, after a probe; off = OpenBLAS's choice; or a name "
           "such as \"SkylakeX\" or \"Haswell\"");
  return s;
}

v1::OptionSchema plugins_schema() {
  v1::OptionSchema s;
  s.string_list("path", {}, "Plugin directories or files, searched after --plugin-path");
  return s;
}

std::string launcher_of(const JobConfig& job) {
  const std::string& l = job.launch.get_string("launcher");
  if (l != "auto") return l;
  return job.accelerator.plugin == "mpi" ? "mpiexec" : "trainrun";
}

// ---------------------------------------------------------------------------------------------
// Job file

struct JobFile::Impl {
  std::string path;
  toml::table root;
};

JobFile::JobFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
JobFile::~JobFile() = default;
JobFile::JobFile(JobFile&&) noexcept = default;
JobFile& JobFile::operator=(JobFile&&) noexcept = default;
const std::string& JobFile::path() const { return impl_->path; }

namespace {

std::string where(const toml::source_region& src, const std::string& fallback) {
  if (src.begin.line == 0) return fallback;
  // A value from --set is located by the flag itself; line and column would be noise.
  if (src.path && src.path->rfind("--set ", 0) == 0) return *src.path;
  std::ostringstream os;
  os << (src.path ? *src.path : fallback) << ":" << src.begin.line << ":" << src.begin.column;
  return os.str();
}

std::string describe_node(const toml::node& n) {
  std::ostringstream os;
  switch (n.type()) {
    case toml::node_type::string: os << "string \"" << *n.value<std::string>() << "\""; break;
    case toml::node_type::integer: os << "integer " << *n.value<int64_t>(); break;
    case toml::node_type::floating_point: os << "float " << *n.value<double>(); break;
    case toml::node_type::boolean: os << "boolean " << (*n.value<bool>() ? "true" : "false"); break;
    case toml::node_type::array: os << "an array"; break;
    case toml::node_type::table: os << "a table"; break;
    default: os << "a date/time"; break;
  }
  return os.str();
}

// Converts one TOML value to the option's type, or throws ConfigError naming the location.
OptionValue convert(const toml::node& node, const OptionSpec& spec, const std::string& loc,
                    const std::string& section) {
  auto bad_type = [&]() -> ConfigError {
    return ConfigError(loc + ": " + section + " " + spec.name + ": expected " +
                       v1::type_name(spec.type) + ", got " + describe_node(node));
  };
  auto check_range = [&](double v, const std::string& shown) {
    // NaN compares false with any bound, so it would pass every range; an infinity passes an
    // open one. Neither is a setting (gradient_clip_val = nan would turn clipping off): a
    // schema accepts an infinity only by naming it as its bound (max = +inf, min = -inf).
    if (std::isnan(v))
      throw ConfigError(loc + ": " + section + " " + spec.name + ": NaN is not a valid value (range " +
                        range_text(spec) + ")");
    if (std::isinf(v) && !((v > 0 && spec.max && std::isinf(*spec.max)) || (v < 0 && spec.min && std::isinf(*spec.min))))
      throw ConfigError(loc + ": " + section + " " + spec.name + ": " + shown +
                        " is not a valid value (a finite number in " + range_text(spec) + ")");
    if ((spec.min && v < *spec.min) || (spec.max && v > *spec.max))
      throw ConfigError(loc + ": " + section + " " + spec.name + ": " + shown +
                        " is out of range " + range_text(spec));
  };
  switch (spec.type) {
    case OptionType::Bool:
      if (auto v = node.value_exact<bool>()) return *v;
      throw bad_type();
    case OptionType::Int:
      if (auto v = node.value_exact<int64_t>()) {
        check_range(static_cast<double>(*v), std::to_string(*v));
        return *v;
      }
      throw bad_type();
    case OptionType::IntOrAuto:
      if (auto v = node.value_exact<int64_t>()) {
        check_range(static_cast<double>(*v), std::to_string(*v));
        return *v;
      }
      if (auto v = node.value_exact<std::string>()) {
        if (*v == "auto") return v1::kAuto;
        throw ConfigError(loc + ": " + section + " " + spec.name + ": expected integer or \"auto\", got string \"" + *v + "\"");
      }
      throw bad_type();
    case OptionType::Float:
      if (node.is_number()) {
        double v = *node.value<double>();
        std::ostringstream os;
        os << v;
        check_range(v, os.str());
        return v;
      }
      throw bad_type();
    case OptionType::String:
      if (auto v = node.value_exact<std::string>()) return *v;
      throw bad_type();
    case OptionType::Choice:
      if (auto v = node.value_exact<std::string>()) {
        if (std::find(spec.choices.begin(), spec.choices.end(), *v) != spec.choices.end()) return *v;
        std::string list;
        for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + c;
        std::string hint = closest(*v, spec.choices);
        throw ConfigError(loc + ": " + section + " " + spec.name + ": '" + *v +
                          "' is not one of: " + list +
                          (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      }
      throw bad_type();
    case OptionType::Size: {
      int64_t bytes = 0;
      if (auto v = node.value_exact<int64_t>()) bytes = *v;
      else if (auto s = node.value_exact<std::string>()) {
        try {
          bytes = parse_size(*s);
        } catch (const std::invalid_argument& e) {
          throw ConfigError(loc + ": " + section + " " + spec.name + ": " + e.what());
        }
      } else throw bad_type();
      check_range(static_cast<double>(bytes), std::to_string(bytes) + " bytes");
      return bytes;
    }
    case OptionType::Duration: {
      double secs = 0;
      if (node.is_number()) secs = *node.value<double>();
      else if (auto s = node.value_exact<std::string>()) {
        try {
          secs = parse_duration(*s);
        } catch (const std::invalid_argument& e) {
          throw ConfigError(loc + ": " + section + " " + spec.name + ": " + e.what());
        }
      } else throw bad_type();
      std::ostringstream os;
      os << secs << " s";
      check_range(secs, os.str());
      return secs;
    }
    case OptionType::IntList: {
      const auto* arr = node.as_array();
      if (!arr) throw bad_type();
      std::vector<int64_t> out;
      for (const auto& e : *arr) {
        auto v = e.value_exact<int64_t>();
        if (!v) throw bad_type();
        check_range(static_cast<double>(*v), std::to_string(*v));
        out.push_back(*v);
      }
      return out;
    }
    case OptionType::StringList: {
      const auto* arr = node.as_array();
      if (!arr) throw bad_type();
      std::vector<std::string> out;
      for (const auto& e : *arr) {
        auto v = e.value_exact<std::string>();
        if (!v) throw bad_type();
        out.push_back(*v);
      }
      return out;
    }
  }
  throw bad_type();
}

// Validates one table against a schema. `skip` lists keys handled by the caller ("plugin").
v1::Options validate_table(const toml::table& table, const v1::OptionSchema& schema,
                           const std::string& section, const std::string& file,
                           const std::string& owner, const std::vector<std::string>& skip = {}) {
  std::map<std::string, OptionValue> values;
  std::vector<std::string> names;
  for (const auto& s : schema.specs()) names.push_back(s.name);
  for (const auto& [key, node] : table) {
    const std::string k(key.str());
    if (std::find(skip.begin(), skip.end(), k) != skip.end()) continue;
    const OptionSpec* spec = schema.find(k);
    // Keys added by --set carry no position of their own; their value points at the flag.
    const std::string loc = key.source().begin.line ? where(key.source(), file)
                                                    : where(node.source(), file);
    if (!spec) {
      std::string hint = closest(k, names);
      std::string known;
      for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
      throw ConfigError(loc + ": unknown key '" + k + "' in " + section + owner +
                        (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                        " (known keys: " + (known.empty() ? "none" : known) + ")");
    }
    values[k] = convert(node, *spec, where(node.source(), loc), section);
  }
  for (const auto& s : schema.specs()) {
    if (values.count(s.name)) continue;
    if (s.required)
      throw ConfigError(where(table.source(), file) + ": " + section + owner +
                        " is missing required key '" + s.name + "' (" + s.help + ")");
    values[s.name] = s.default_value;
  }
  return v1::Options(std::move(values), section + " (" + file + ")");
}

// Inserts `value` (parsed as TOML, else taken as a string) at dotted `key` in root.
void apply_override(toml::table& root, const std::string& assignment) {
  const std::string origin = "--set " + assignment;
  auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError(origin + ": expected key=value (e.g. --set trainer.max_steps=100)");
  const std::string key = trim(assignment.substr(0, eq));
  const std::string value = trim(assignment.substr(eq + 1));
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) {
    if (p.empty()) throw ConfigError(origin + ": empty component in key '" + key + "'");
    parts.push_back(p);
  }
  toml::table doc;
  try {
    doc = toml::parse("v = " + value, std::string_view(origin));
  } catch (const toml::parse_error&) {
    // Not a TOML value: take it as a string, still parsed so errors point at the --set flag.
    std::ostringstream quoted;
    quoted << toml::value<std::string>(value);
    doc = toml::parse("v = " + quoted.str(), std::string_view(origin));
  }
  toml::node* cur = &root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (auto* tbl = cur->as_table()) {
      if (!tbl->contains(parts[i])) tbl->insert(parts[i], toml::table{});
      cur = tbl->get(parts[i]);
    } else if (auto* arr = cur->as_array()) {
      size_t idx = 0;
      try {
        idx = std::stoul(parts[i]);
      } catch (...) {
        throw ConfigError(origin + ": '" + parts[i] + "' must be an array index");
      }
      if (idx >= arr->size())
        throw ConfigError(origin + ": index " + parts[i] + " is past the end of the array");
      cur = arr->get(idx);
    } else {
      throw ConfigError(origin + ": '" + parts[i] + "' is not a table");
    }
  }
  auto* tbl = cur->as_table();
  if (!tbl) throw ConfigError(origin + ": '" + key + "' does not name a table key");
  tbl->insert_or_assign(parts.back(), std::move(*doc.get("v")));
}

// `schema` (where known) turns an IntOrAuto option's kAuto back into "auto".
toml::table to_toml(const v1::Options& opts, const std::string& plugin,
                    const v1::OptionSchema* schema) {
  toml::table t;
  if (!plugin.empty()) t.insert("plugin", plugin);
  for (const auto& [k, v] : opts.values()) {
    if (const auto* spec = schema ? schema->find(k) : nullptr;
        spec && spec->type == OptionType::IntOrAuto && std::holds_alternative<int64_t>(v) &&
        std::get<int64_t>(v) == v1::kAuto) {
      t.insert(k, "auto");
      continue;
    }
    // A lambda may not capture a structured binding before C++20 (clang refuses; scripts/fuzz).
    const std::string& key = k;
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::monostate>) {
          } else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                               std::is_same_v<T, std::vector<std::string>>) {
            toml::array a;
            for (const auto& e : x) a.push_back(e);
            t.insert(key, std::move(a));
          } else {
            t.insert(key, x);
          }
        },
        v);
  }
  return t;
}

}  // namespace

JobFile JobFile::load(const std::string& path, const std::vector<std::string>& overrides) {
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  // toml++ reads a directory as an empty document, which would then be reported as a job
  // without its tables.
  if (std::filesystem::is_directory(path))
    throw ConfigError(path + ": is a directory, not a job file (give the .toml file inside it)");
  try {
    impl->root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    std::ostringstream os;
    os << path << ":" << src.begin.line << ":" << src.begin.column << ": " << e.description();
    if (src.begin.line == 0) os.str(path + ": " + std::string(e.description()));
    throw ConfigError(os.str());
  }
  for (const auto& o : overrides) apply_override(impl->root, o);
  return JobFile(std::move(impl));
}

std::vector<std::string> JobFile::plugin_paths() const {
  const auto* t = impl_->root.get_as<toml::table>("plugins");
  if (!t) return {};
  auto opts = validate_table(*t, plugins_schema(), "[plugins]", impl_->path, "");
  return opts.get_string_list("path");
}

namespace {
struct SectionSpec {
  const char* key;
  ComponentKind kind;
  const char* default_plugin;  // nullptr = required
};
const SectionSpec kSections[] = {
    {"model", ComponentKind::Model, nullptr},
    {"data", ComponentKind::Dataset, nullptr},
    {"strategy", ComponentKind::Strategy, "single"},
    {"accelerator", ComponentKind::Accelerator, "cpu"},
    {"precision", ComponentKind::Precision, "fp32"},
    {"optimizer", ComponentKind::Optimizer, "adamw"},
};
}  // namespace

namespace {
// [launch] blas_coretype: a misspelt kernel would otherwise only be found by the probe, after
// the job has started. Throws ConfigError with the key's place and the closest known name.
void check_blas_coretype(const std::string& k, const toml::table& root, const std::string& file) {
  if (k == "auto" || k == "off" || !canonical_kernel(k).empty()) return;
  const auto* launch_table = root.get_as<toml::table>("launch");
  const toml::node* n = launch_table ? launch_table->get("blas_coretype") : nullptr;
  std::vector<std::string> names = {"auto", "off"};
  std::stringstream ks(known_kernels());
  for (std::string item; std::getline(ks, item, ',');) names.push_back(item.substr(item.find_first_not_of(' ')));
  const std::string hint = closest(k, names);
  throw ConfigError((n ? where(n->source(), file) : file) + ": [launch] blas_coretype: '" + k +
                    "' is not an OpenBLAS kernel name trainrun knows" +
                    (hint.empty() ? "" : " (did you mean '" + hint + "'?)") +
                    "; use \"auto\", \"off\" or one of: " + known_kernels());
}
}  // namespace

JobConfig JobFile::validate(const Registry& registry) const {
  const auto& root = impl_->root;
  const std::string& file = impl_->path;
  JobConfig job;
  job.file = file;

  std::vector<std::string> top = {"trainer", "launch", "plugins", "callbacks"};
  for (const auto& s : kSections) top.push_back(s.key);
  for (const auto& [key, node] : root) {
    const std::string k(key.str());
    if (std::find(top.begin(), top.end(), k) != top.end()) {
      bool ok = k == "callbacks" ? node.is_array_of_tables() : node.is_table();
      if (!ok)
        throw ConfigError(where(key.source(), file) + ": '" + k + "' must be " +
                          (k == "callbacks" ? "an array of tables ([[callbacks]])" : "a table ([" + k + "])"));
      continue;
    }
    std::string hint = closest(k, top);
    throw ConfigError(where(key.source(), file) + ": unknown table '" + k + "'" +
                      (hint.empty() ? "" : "; did you mean '" + hint + "'?"));
  }

  static const toml::table empty;
  auto table_or_empty = [&](const char* k) -> const toml::table& {
    const auto* t = root.get_as<toml::table>(k);
    return t ? *t : empty;
  };
  job.trainer = validate_table(table_or_empty("trainer"), trainer_schema(), "[trainer]", file, "");
  job.launch = validate_table(table_or_empty("launch"), launch_schema(), "[launch]", file, "");
  check_blas_coretype(job.launch.get_string("blas_coretype"), root, file);
  validate_table(table_or_empty("plugins"), plugins_schema(), "[plugins]", file, "");

  // The batch layout depends only on the job, so `trainrun check` catches a bad one too.
  {
    const int64_t world = job.launch.get_int("nproc_per_node") * job.launch.get_int("nnodes");
    const int64_t global = job.trainer.get_int("global_batch_size");
    const int64_t micro = job.trainer.get_int("micro_batch_size");
    const auto* trainer_table = root.get_as<toml::table>("trainer");
    auto loc_of = [&](const char* key) {
      const toml::node* n = trainer_table ? trainer_table->get(key) : nullptr;
      return n ? where(n->source(), file) : file;
    };
    const std::string error = batch_layout_error(global, micro, world);
    if (!error.empty())
      throw ConfigError(loc_of(micro == 0 ? "global_batch_size" : "micro_batch_size") + ": " +
                        error);
  }

  auto component = [&](const toml::table& t, ComponentKind kind, const std::string& section,
                       const char* default_plugin) {
    ComponentConfig c;
    c.kind = kind;
    c.section = section;
    const toml::node* pn = t.get("plugin");
    if (pn) {
      auto v = pn->value_exact<std::string>();
      if (!v)
        throw ConfigError(where(pn->source(), file) + ": " + section +
                          " plugin: expected string, got " + describe_node(*pn));
      c.plugin = *v;
    } else if (default_plugin) {
      c.plugin = default_plugin;
    } else {
      std::string w = t.source().begin.line ? where(t.source(), file) : file;
      std::string found;
      for (const auto* ci : registry.components(kind)) found += (found.empty() ? "" : ", ") + ci->name;
      throw ConfigError(w + ": " + section + " needs a key 'plugin' (" + v1::kind_name(kind) +
                        " plugins found: " + (found.empty() ? "none" : found) + ")");
    }
    std::string loc = pn ? where(pn->source(), file) : (t.source().begin.line ? where(t.source(), file) : file);
    c.info = &registry.require(kind, c.plugin, loc + ": " + section);
    c.options = validate_table(t, c.info->schema, section, file, " (plugin '" + c.plugin + "')",
                               {"plugin"});
    return c;
  };

  ComponentConfig* slots[] = {&job.model,       &job.data,      &job.strategy,
                              &job.accelerator, &job.precision, &job.optimizer};
  for (size_t i = 0; i < std::size(kSections); ++i) {
    const auto& s = kSections[i];
    if (!root.contains(s.key) && !s.default_plugin)
      throw ConfigError(file + ": missing table [" + s.key + "] (it must name a plugin, e.g. plugin = \"" +
                        (s.kind == ComponentKind::Model ? "cnn" : "idx") + "\")");
    *slots[i] = component(table_or_empty(s.key), s.kind, std::string("[") + s.key + "]",
                          s.default_plugin);
  }
  if (const auto* arr = root.get_as<toml::array>("callbacks")) {
    // Numbered from 0, as `--set callbacks.0.key=...` addresses them.
    size_t i = 0;
    for (const auto& n : *arr)
      job.callbacks.push_back(component(*n.as_table(), ComponentKind::Callback,
                                        "[[callbacks]][" + std::to_string(i++) + "]", nullptr));
  }
  // Every run leaves metrics.jsonl, TensorBoard event files and report.html behind, listed or
  // not: the callbacks that write them join the job here, after the listed ones, so the run's
  // job.toml and `trainrun check` show them. A listed one replaces its default (so
  // `plugin = "tensorboard"` with `enabled = false` turns it off). One whose plugin is not
  // installed is left out; the run warns about it (Run::add_default_callbacks).
  for (const auto& d : kDefaultCallbacks) {
    const std::string name = d.plugin;
    const bool listed = std::any_of(job.callbacks.begin(), job.callbacks.end(),
                                    [&](const ComponentConfig& c) { return c.plugin == name; });
    if (!listed && registry.find(ComponentKind::Callback, name))
      job.callbacks.push_back(component(toml::table{}, ComponentKind::Callback,
                                        "[[callbacks]] " + name + " (default)", d.plugin));
  }

  // The node layout, with the launcher's own checks (launch_layout_problem), so `trainrun check`
  // reports what a launch would refuse, at the key's place in the file. After the components:
  // the launcher depends on the accelerator (launcher_of).
  {
    LaunchSpec layout;
    layout.nproc_per_node = static_cast<int>(job.launch.get_int("nproc_per_node"));
    layout.nnodes = static_cast<int>(job.launch.get_int("nnodes"));
    layout.node_rank = static_cast<int>(job.launch.get_int("node_rank"));
    layout.master_port = static_cast<int>(job.launch.get_int("master_port"));
    layout.rendezvous_timeout_s = job.launch.get_seconds("rendezvous_timeout_s");
    layout.grace_s = job.launch.get_seconds("stop_grace_s");
    layout.save_timeout_s = job.launch.get_seconds("stop_save_timeout_s");
    layout.mpiexec = launcher_of(job) == "mpiexec";
    layout.max_restarts = static_cast<int>(job.launch.get_int("max_restarts"));
    if (const auto problem = launch_layout_problem(layout)) {
      const auto* launch_table = root.get_as<toml::table>("launch");
      const toml::node* n = launch_table ? launch_table->get(problem->key) : nullptr;
      throw ConfigError((n ? where(n->source(), file) : file) + ": " + problem->message);
    }
  }

  // Resolved job: every table with its defaults, for the run directory and `trainrun check`.
  toml::table out;
  const v1::OptionSchema trainer_s = trainer_schema(), launch_s = launch_schema();
  out.insert("trainer", to_toml(job.trainer, "", &trainer_s));
  out.insert("launch", to_toml(job.launch, "", &launch_s));
  for (size_t i = 0; i < std::size(kSections); ++i)
    out.insert(kSections[i].key, to_toml(slots[i]->options, slots[i]->plugin,
                                         slots[i]->info ? &slots[i]->info->schema : nullptr));
  if (!job.callbacks.empty()) {
    toml::array cbs;
    for (const auto& c : job.callbacks)
      cbs.push_back(to_toml(c.options, c.plugin, c.info ? &c.info->schema : nullptr));
    out.insert("callbacks", std::move(cbs));
  }
  std::ostringstream os;
  os << toml::toml_formatter(out) << "\n";
  job.resolved_toml = os.str();
  return job;
}

}  // namespace trainrun::core
