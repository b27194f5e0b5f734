// The trainrun command line (Boost.Program_options):
//   trainrun --config job.toml [--set key=value]... [--plugin-path P]...   train
//   trainrun check --config job.toml [--set ...]                           validate, print the job
//   trainrun plugins [NAME]                                                list plugins / options
//   trainrun <subcommand> ...                                              the table subcommands()
// Exit codes: 0 success, 1 failure while training, 2 bad input (job file, option, plugin),
// 130 interrupted. A job whose [launch] asks for more than one process is launched: this process
// becomes the node agent and runs its own command line again once per worker (core/launcher).
#include <boost/program_options.hpp>
#include <c10/util/Exception.h>

#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "build_info.hpp"
#include "chat_cli.hpp"
#include "collectives.hpp"
#include "command_line.hpp"
#include "commands.hpp"
#include "export_cli.hpp"
#include "generate_cli.hpp"
#include "score_cli.hpp"
#include "eval_cli.hpp"
#include "merge_lora.hpp"
#include "report.hpp"
#include "reward_cli.hpp"
#include "text_cli.hpp"
#include "tokenize_cli.hpp"
#include "trainrun/core/checkpoint.hpp"
#include "trainrun/core/config.hpp"
#include "trainrun/core/launcher.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/memory.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/rewards.hpp"
#include "trainrun/core/runtime.hpp"
#include "trainrun/core/trainer.hpp"

namespace po = boost::program_options;
using namespace trainrun;
using core::Registry;

namespace {

std::string show(const v1::OptionValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        std::ostringstream os;
        if constexpr (std::is_same_v<T, std::monostate>) os << "(required)";
        else if constexpr (std::is_same_v<T, bool>) os << (x ? "true" : "false");
        else if constexpr (std::is_same_v<T, std::string>) os << '"' << x << '"';
        else if constexpr (std::is_same_v<T, std::vector<int64_t>> ||
                           std::is_same_v<T, std::vector<std::string>>) {
          os << "[";
          for (size_t i = 0; i < x.size(); ++i) os << (i ? ", " : "") << x[i];
          os << "]";
        } else os << x;
        return os.str();
      },
      v);
}

std::string range(const v1::OptionSpec& s) {
  if (!s.choices.empty()) {
    std::string out;
    for (const auto& c : s.choices) out += (out.empty() ? "" : "|") + c;
    return out;
  }
  if (!s.min && !s.max) return "";
  return core::range_text(s);
}

void print_schema(const v1::OptionSchema& schema) {
  // Columns as wide as their longest entry (plus two spaces), so no two values run together.
  struct Row {
    std::string name, type, def, range, help;
  };
  std::vector<Row> rows = {{"option", "type", "default", "range", "help"}};
  for (const auto& s : schema.specs()) {
    std::string type = v1::type_name(s.type);
    const bool is_auto = s.type == v1::OptionType::IntOrAuto &&
                         std::holds_alternative<int64_t>(s.default_value) &&
                         std::get<int64_t>(s.default_value) == v1::kAuto;
    rows.push_back({s.name, s.type == v1::OptionType::IntOrAuto ? "int|auto" : type.substr(0, type.find(' ')),
                    is_auto ? "\"auto\"" : show(s.default_value), range(s), s.help});
  }
  size_t w[4] = {0, 0, 0, 0};
  for (const auto& r : rows) {
    w[0] = std::max(w[0], r.name.size() + 2);
    w[1] = std::max(w[1], r.type.size() + 2);
    w[2] = std::max(w[2], std::min<size_t>(r.def.size() + 2, 24));
    w[3] = std::max(w[3], std::min<size_t>(r.range.size() + 2, 24));
  }
  for (const auto& r : rows) {
    auto cell = [](const std::string& v, size_t width) {
      // A value wider than its column keeps two spaces after it rather than touching the next.
      return v.size() + 2 > width ? v + "  " : v + std::string(width - v.size(), ' ');
    };
    std::cout << "  " << cell(r.name, w[0]) << cell(r.type, w[1]) << cell(r.def, w[2])
              << cell(r.range, w[3]) << r.help << "\n";
  }
}

int cmd_plugins(const Registry& reg, const std::string& name) {
  if (name.empty()) {
    std::cout << std::left << std::setw(18) << "name" << std::setw(13) << "kind" << std::setw(22)
              << "plugin" << std::setw(10) << "version" << std::setw(6) << "ABI" << "file\n";
    for (const auto* c : reg.all_components()) {
      std::string abi;
      for (const auto& p : reg.plugins())
        if (p.file == c->file) abi = std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor);
      std::cout << std::left << std::setw(18) << c->name << std::setw(13) << v1::kind_name(c->kind)
                << std::setw(22) << c->plugin_name << std::setw(10) << c->plugin_version
                << std::setw(6) << abi << c->file << "\n";
    }
    for (const auto& s : reg.skipped()) std::cout << "skipped: " << s.file << ": " << s.reason << "\n";
    return 0;
  }
  bool found = false;
  for (const auto* c : reg.all_components()) {
    if (c->name != name) continue;
    found = true;
    std::cout << v1::kind_name(c->kind) << " '" << c->name << "' — " << c->summary << "\n"
              << "  plugin " << c->plugin_name << " " << c->plugin_version << ", " << c->file
              << "\n";
    print_schema(c->schema);
  }
  for (const char* section : {"trainer", "launch", "parallel", "eval", "plugins"}) {
    if (name != section) continue;
    found = true;
    std::cout << "[" << section << "] (core)\n";
    print_schema(name == "trainer"    ? core::trainer_schema()
                 : name == "launch"   ? core::launch_schema()
                 : name == "parallel" ? core::parallel_schema()
                 : name == "eval"     ? core::eval_schema()
                                      : core::plugins_schema());
  }
  if (!found) {
    std::vector<std::string> names;
    for (const auto* c : reg.all_components()) names.push_back(c->name);
    std::string hint = core::closest(name, names);
    std::cerr << "trainrun: error: no plugin component named '" << name << "'"
              << (hint.empty() ? "" : "; did you mean '" + hint + "'?") << std::endl;
    return 2;
  }
  return 0;
}

// One write for the whole line: a worker's stderr is a pipe that the launcher (or mpiexec)
// reads in chunks, and a worker stopped mid-line would otherwise leave half a message.
void print_error(const std::string& message, const std::string& command = "trainrun") {
  std::cerr << (command + ": error: " + message + "\n") << std::flush;
}

// The agent's plan for this node, from a validated job.
core::LaunchSpec launch_spec(const core::JobConfig& job, int argc, char** argv) {
  core::LaunchSpec spec;
  spec.nproc_per_node = static_cast<int>(job.launch.get_int("nproc_per_node"));
  spec.nnodes = static_cast<int>(job.launch.get_int("nnodes"));
  spec.node_rank = static_cast<int>(job.launch.get_int("node_rank"));
  spec.master_addr = job.launch.get_string("master_addr");
  spec.master_port = static_cast<int>(job.launch.get_int("master_port"));
  spec.store_listen_all = job.launch.get_string("store_listen") == "all";
  spec.rendezvous_timeout_s = job.launch.get_seconds("rendezvous_timeout_s");
  spec.grace_s = job.launch.get_seconds("stop_grace_s");
  spec.save_timeout_s = job.launch.get_seconds("stop_save_timeout_s");
  spec.run_dir = core::run_dir_of(job);
  spec.rotate_run_dir = true;
  spec.mpiexec = core::launcher_of(job) == "mpiexec";
  spec.max_restarts = static_cast<int>(job.launch.get_int("max_restarts"));
  // Workers run this very command again and find out who they are from the environment.
  spec.argv.push_back(core::self_executable());
  for (int i = 1; i < argc; ++i) spec.argv.push_back(argv[i]);
  return spec;
}

int print_help(const po::options_description& opts) {
  std::cout << "usage: trainrun --config job.toml [--set key=value]...\n"
               "       trainrun check --config job.toml [--set key=value]... [--plugin-path P]...\n"
               "       trainrun plugins [NAME]\n";
  for (const auto& c : app::subcommands()) {
    std::string usage = c.usage;
    for (size_t at = 0; !usage.empty() && at != std::string::npos;) {
      const size_t nl = usage.find('\n', at);
      std::cout << "       trainrun " << usage.substr(at, nl == std::string::npos ? nl : nl - at)
                << "\n";
      at = nl == std::string::npos ? nl : nl + 1;
    }
  }
  std::cout << "\n" << opts << std::endl;
  return 0;
}

int print_version() {
  std::cout << "trainrun " << TRAINRUN_VERSION << " (ABI " << v1::kAbiMajor << "." << v1::kAbiMinor
            << ", LibTorch " << TRAINRUN_BUILD_TORCH_VERSION
            << (std::string(TRAINRUN_BUILD_TORCH_CUDA).empty()
                    ? std::string(" CPU-only")
                    : std::string(" with CUDA ") + TRAINRUN_BUILD_TORCH_CUDA)
            << " from " << TRAINRUN_BUILD_TORCH_ORIGIN << ")" << std::endl;
  return 0;
}

// The resolved job as check prints it: with [model] path, the model as built from there (the
// inline-architecture keys are left out of the resolved job, config.cpp).
std::string resolved_for_check(const core::JobConfig& job, const std::string& built) {
  const std::string header = "[model]\n";
  std::string out = job.resolved_toml;
  const v1::Options& mo = job.model.options;
  const size_t at = out.find(header);
  if (at != std::string::npos && mo.has("path") &&
      std::holds_alternative<std::string>(mo.values().at("path")) && !mo.get_string("path").empty())
    out.insert(at + header.size(), "# built from path: " + built + "\n");
  return out;
}

// `trainrun check`: the resolved job, its components, runtime and memory estimate. Everything
// that can fail (rewards, the model, data and adapters the estimate builds) runs before anything
// is printed, so an error is the only output, and "valid" comes last, once all was checked.
int print_check(const std::string& config, const core::JobConfig& job, const Registry& reg) {
  // Created, as a run would, so options only a constructor can judge (a regex) fail here.
  if (!job.rewards.empty()) core::RewardSet(job, reg, core::offline_reward_context(job));
  const core::MemoryCheck memory = core::check_memory(job, reg);
  std::cout << resolved_for_check(job, memory.model);
  std::cout << "# components\n";
  for (const auto* c :
       {&job.model, &job.data, &job.strategy, &job.accelerator, &job.precision, &job.optimizer})
    std::cout << "#   " << std::left << std::setw(12) << v1::kind_name(c->kind) << c->plugin << " ("
              << c->info->file << ")\n";
  if (!job.objective.plugin.empty())
    std::cout << "#   " << std::left << std::setw(12) << "objective" << job.objective.plugin << " ("
              << job.objective.info->file << ")\n";
  for (const auto& c : job.callbacks)
    std::cout << "#   " << std::left << std::setw(12) << "callback" << c.plugin << " ("
              << c.info->file << ")\n";
  for (const auto& r : job.rewards)
    std::cout << "#   " << std::left << std::setw(12) << "reward" << r.component.plugin << " '"
              << r.name << "' x " << r.weight << " (" << r.component.info->file << ")\n";
  std::vector<std::string> accelerators;
  for (const auto* c : reg.all_components())
    if (c->kind == v1::ComponentKind::Accelerator) accelerators.push_back(c->name);
  std::cout << "# runtime\n";
  for (const auto& line : core::check_runtime_lines(job, accelerators))
    std::cout << "#   " << line << "\n";
  std::cout << "# memory estimate (ZeRO stages 0-3)\n";
  for (const auto& line : memory.lines) std::cout << "#   " << line << "\n";
  std::cout << "# " << config << ": valid" << std::endl;
  return 0;
}

}  // namespace

namespace trainrun::app {
int report_failure(const std::string& command) {
  try {
    throw;
  } catch (const v1::ConfigError& e) {
    print_error(e.what(), command);
    return 2;
  } catch (const v1::PluginError& e) {
    print_error(e.what(), command);
    return 2;
  } catch (const c10::Error& e) {
    print_error(e.what_without_backtrace(), command);
    return 1;
  } catch (const std::exception& e) {
    print_error(e.what(), command);
    return 1;
  }
}

const std::vector<Command>& subcommands() {
  static const std::vector<Command> table = {
      {"consolidate", "consolidate <checkpoint dir> <out dir> [--max-shard-size 5GB]",
       run_consolidate_command},
      {"export",
       "export CHECKPOINT --output DIR [--dtype bfloat16] [--max-shard-size 5GB] (an HF model "
       "directory); export CHECKPOINT|HF_DIR --format gguf --output F.gguf [--type q8_0] "
       "(llama.cpp)",
       run_export_command},
      {"merge-lora",
       "merge-lora --base HF_DIR|FILE --adapter DIR --output DIR|FILE [--plain-base] "
       "[--max-shard-size 5GB] [--plugin-path P]",
       run_merge_lora_command},
      {"encode", "encode|decode --tokenizer DIR [--jsonl] (see trainrun encode --help)",
       run_encode_command},
      {"decode", "", run_decode_command},
      {"tokenize",
       "tokenize --tokenizer DIR --output corpus.bin FILES... (see trainrun tokenize --help)",
       run_tokenize_command},
      {"generate",
       "generate --model HF_DIR [--adapter DIR] [--chat] --prompt TEXT --max-new-tokens N (see "
       "trainrun generate "
       "--help)",
       run_generate_command},
      {"score",
       "score --model HF_DIR --input pairs.jsonl | --text TEXT [--jsonl] (a reward model's scores; "
       "see trainrun score --help)",
       run_score_command},
      {"eval",
       "eval --model HF_DIR --tasks TASK.yaml|DIR [--num-fewshot N] [--output results.json] "
       "(lm-eval tasks; see trainrun eval --help)",
       run_eval_command},
      {"reward",
       "reward --config job.toml --input rows.jsonl (the job's [[rewards]] on completions; see "
       "trainrun reward --help)",
       run_reward_command},
      {"chat-template", "chat-template --tokenizer DIR [--add-generation-prompt] [--template NAME]",
       run_chat_template_command},
      {"report", "report RUN_DIR [--compare OTHER_RUN_DIR]... [--output FILE]", run_report_command},
      {"bench",
       "bench collectives --backend gloo-cpu|mpi --nproc N [--verify] (see trainrun bench "
       "collectives --help)",
       run_bench_command},
      // The child process of the BLAS kernel probe (core/runtime.hpp), not a user command.
      {"blas-probe", "", [](int, char**) { return core::blas_probe_main(); }, /*internal=*/true},
  };
  return table;
}
}  // namespace trainrun::app

int main(int argc, char** argv) {
  // Before anything allocates: every rank's CPU bytes are counted from here on (the metrics'
  // mem_* fields, Accelerator::memory_stats, trainrun/runtime/memory.hpp).
  core::install_memory_tracker();
  // Each subcommand parses its own flags (Boost.PO rejects flags it does not know), so the
  // table is consulted before main()'s own parser.
  if (argc > 1)
    for (const auto& c : app::subcommands())
      if (argv[1] == std::string(c.name)) return c.run(argc, argv);
  po::options_description opts("trainrun options");
  std::string config, command, name;
  std::vector<std::string> overrides, plugin_paths;
  std::string nproc_per_node, nnodes, node_rank, master_addr, master_port;
  opts.add_options()("help,h", "show this help")("version", "print the version")(
      "config,c", po::value(&config), "job file (TOML)")(
      "set", po::value(&overrides)->composing(), "override a job key: --set trainer.max_steps=100")(
      "plugin-path", po::value(&plugin_paths)->composing(),
      "plugin directory or file, searched first (repeatable)")(
      "nproc-per-node", po::value(&nproc_per_node), "worker processes on this node (= --set launch.nproc_per_node=N)")(
      "nnodes", po::value(&nnodes), "number of nodes (= --set launch.nnodes=N)")(
      "node-rank", po::value(&node_rank), "this node's index (= --set launch.node_rank=N)")(
      "master-addr", po::value(&master_addr), "node 0's address (= --set launch.master_addr=HOST)")(
      "master-port", po::value(&master_port), "rendezvous port (= --set launch.master_port=PORT)");
  po::options_description hidden;
  hidden.add_options()("command", po::value(&command))("name", po::value(&name));
  po::positional_options_description pos;
  pos.add("command", 1).add("name", 1);
  po::variables_map vm;
  if (!app::store_command_line(argc, argv, "trainrun", opts, hidden, pos, vm)) return 2;
  if (vm.count("help")) return print_help(opts);
  if (vm.count("version")) return print_version();
  // A cluster's job controller (a Kubeflow PyTorchJob pod) gives the layout through the
  // environment: after the job file and --set, before the launch flags, which win.
  std::optional<core::ClusterLaunch> cluster;
  try {
    cluster = core::cluster_launch_from_environment();
  } catch (const v1::ConfigError& e) {
    print_error(e.what());
    return 2;
  }
  if (cluster) {
    std::string said;
    for (const auto& [key, value] : cluster->launch) {
      overrides.push_back("launch." + key + "=" + value);
      said += (said.empty() ? "" : ", ") + key + " " + value;
    }
    std::cerr << "trainrun: " << cluster->source << " environment: " << said << "\n";
    for (const auto& n : cluster->notes) std::cerr << "trainrun: " << n << "\n";
  }
  // The launch flags are --set overrides, applied after the --set flags, so they win.
  for (const auto& [key, value] : {std::pair{"nproc_per_node", &nproc_per_node}, {"nnodes", &nnodes},
                                   {"node_rank", &node_rank}, {"master_addr", &master_addr},
                                   {"master_port", &master_port}})
    if (!value->empty()) overrides.push_back(std::string("launch.") + key + "=" + *value);
  if (command.empty()) command = "train";
  if (command != "train" && command != "check" && command != "plugins") {
    std::string names = "train, check, plugins";
    for (const auto& c : app::subcommands())
      if (!c.internal) names += std::string(", ") + c.name;
    std::cerr << "trainrun: error: unknown command '" << command << "' (commands: " << names << ")"
              << std::endl;
    return 2;
  }
  try {
    Registry reg;
    if (command == "plugins") {
      reg.load_search_path(Registry::search_path(plugin_paths, {}));
      for (const auto& w : reg.warnings()) core::log_warn(w);
      return cmd_plugins(reg, name);
    }
    if (config.empty()) {
      std::cerr << "trainrun: error: --config job.toml is required" << std::endl;
      return 2;
    }
    if (!std::filesystem::exists(config)) {
      std::cerr << "trainrun: error: job file '" << config << "' does not exist" << std::endl;
      return 2;
    }
    auto job_file = core::JobFile::load(config, overrides);
    reg.load_search_path(Registry::search_path(plugin_paths, job_file.plugin_paths()));
    for (const auto& w : reg.warnings()) core::log_warn(w);
    core::JobConfig job = job_file.validate(reg);
    if (command == "check") return print_check(config, job, reg);
    const bool launching = !core::detect_worker_environment().is_worker &&
                           (job.launch.get_int("nproc_per_node") * job.launch.get_int("nnodes") > 1 ||
                            job.launch.get_int("max_restarts") > 0);
    // Before anything starts: may run this command again with another OpenBLAS kernel.
    core::select_blas_kernel(job, argv, launching);
    if (launching) return core::launch(launch_spec(job, argc, argv));
    core::keep_freed_memory();
    return core::train(job, reg);
  } catch (...) {
    return app::report_failure("trainrun");
  }
}
