// `trainrun reward` (see reward_cli.hpp): rows are scored in batches of --batch-size, each batch
// by every reward in the job's order, as the GRPO objective will score a rollout's completions.
#include "reward_cli.hpp"

#include <boost/program_options.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "command_line.hpp"
#include "commands.hpp"
#include "trainrun/core/config.hpp"
#include "trainrun/core/log.hpp"
#include "trainrun/core/registry.hpp"
#include "trainrun/core/rewards.hpp"

namespace po = boost::program_options;
using nlohmann::ordered_json;

namespace trainrun::app {
namespace {

// One input line as a reward sees it: the completion and prompt taken out, the rest the row.
v1::RewardSample parse_row(const std::string& line, const std::string& where, int64_t index) {
  auto bad = [&](const std::string& m) { throw v1::ConfigError(where + ": " + m); };
  ordered_json j = ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) bad("expected a JSON object");
  v1::RewardSample s;
  s.row_index = index;
  if (!j.contains("completion") || !j["completion"].is_string())
    bad("\"completion\" must be a string");
  s.completion = j["completion"].get<std::string>();
  j.erase("completion");
  if (j.contains("completion_ids")) {
    const ordered_json& ids = j["completion_ids"];
    if (!ids.is_array()) bad("\"completion_ids\" must be a list of token ids");
    for (const auto& id : ids) {
      if (!id.is_number_integer()) bad("\"completion_ids\" must be a list of token ids");
      s.completion_ids.push_back(id.get<int64_t>());
    }
    j.erase("completion_ids");
  }
  if (j.contains("prompt")) {
    if (!j["prompt"].is_string()) bad("\"prompt\" must be a string");
    s.prompt = j["prompt"].get<std::string>();
  }
  s.row = j.dump();
  return s;
}

struct Tally {
  double sum = 0, sum_sq = 0;
  int64_t count = 0;
  void add(double v) {
    if (std::isnan(v)) return;
    sum += v;
    sum_sq += v * v;
    ++count;
  }
  std::string text() const {
    if (count == 0) return "no scores";
    const double mean = sum / count;
    const double var = count > 1 ? std::max(0.0, (sum_sq - count * mean * mean) / (count - 1)) : 0;
    std::ostringstream os;
    os << "mean " << mean << " std " << std::sqrt(var) << " (" << count << " scored)";
    return os.str();
  }
};

}  // namespace

int run_reward_command(int argc, char** argv) {
  po::options_description opts("trainrun reward options");
  std::string config, input;
  std::vector<std::string> overrides, plugin_paths;
  int64_t batch_size = 64;
  opts.add_options()("help,h", "show this help")("config,c", po::value(&config),
                                                 "job file (TOML) with [[rewards]]")(
      "input,i", po::value(&input),
      "JSONL rows: \"completion\", optional \"prompt\" and \"completion_ids\", other fields")(
      "set", po::value(&overrides)->composing(), "override a job key: --set rewards.0.weight=2")(
      "plugin-path", po::value(&plugin_paths)->composing(),
      "plugin directory or file, searched first (repeatable)")(
      "batch-size", po::value(&batch_size)->default_value(64), "rows per call of each reward");
  po::variables_map vm;
  if (auto rc = parse_command_line(
          argc, argv, "reward",
          "usage: trainrun reward --config job.toml --input rows.jsonl [--set key=value]...", opts,
          vm))
    return *rc;
  if (config.empty() || input.empty())
    return command_error("reward", "--config job.toml and --input rows.jsonl are required");
  if (batch_size < 1) return command_error("reward", "--batch-size must be at least 1");
  try {
    auto job_file = core::JobFile::load(config, overrides);
    core::Registry reg;
    reg.load_search_path(core::Registry::search_path(plugin_paths, job_file.plugin_paths()));
    for (const auto& w : reg.warnings()) core::log_warn(w);
    const core::JobConfig job = job_file.validate(reg);
    if (job.rewards.empty()) throw v1::ConfigError(config + ": the job has no [[rewards]] table");
    core::RewardSet rewards(job, reg, core::offline_reward_context(job));
    std::ifstream in(input);
    if (!in) throw v1::ConfigError(input + ": cannot open");
    std::vector<Tally> tallies(rewards.size() + 1);
    std::vector<v1::RewardSample> batch;
    auto flush = [&] {
      if (batch.empty()) return;
      const auto scores = rewards.score(batch);
      const auto total = rewards.combine(scores);
      for (size_t s = 0; s < batch.size(); ++s) {
        ordered_json line, per = ordered_json::object();
        line["row"] = batch[s].row_index;
        for (size_t i = 0; i < rewards.size(); ++i) {
          per[rewards.name(i)] = scores[i][s];  // NaN is written as null
          tallies[i].add(scores[i][s]);
        }
        line["rewards"] = std::move(per);
        line["reward"] = total[s];
        tallies.back().add(total[s]);
        std::cout << line.dump() << "\n";
      }
      batch.clear();
    };
    int64_t row = 0, line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      batch.push_back(parse_row(line, input + ":" + std::to_string(line_no), row++));
      if (static_cast<int64_t>(batch.size()) == batch_size) flush();
    }
    flush();
    std::cout.flush();
    for (size_t i = 0; i < rewards.size(); ++i)
      std::cerr << "trainrun reward: " << rewards.name(i) << " (weight " << rewards.weight(i)
                << "): " << tallies[i].text() << "\n";
    std::cerr << "trainrun reward: weighted sum over " << row << " rows: " << tallies.back().text()
              << std::endl;
    return 0;
  } catch (...) {
    return report_failure("trainrun reward");
  }
}

}  // namespace trainrun::app
