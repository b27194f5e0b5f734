#pragma once
// A task file as read (task_config.cpp): lm-eval's TaskConfig and FewshotConfig fields that
// trainrun eval supports, with lm-eval's defaults, and the task's documents per split.
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trainrun/eval/harness.hpp"

namespace trainrun::eval {

struct MetricConfig {
  std::string name, aggregation;
  bool higher_is_better = true;
  Json kwargs = Json::object();  // exact_match's options
};

struct FilterConfig {
  std::string name;
  std::vector<Json> steps;  // {"function": ..., options}
};

struct FewshotConfig {
  std::string sampler = "default";
  std::string split;  // empty: lm-eval's fallback (training, else validation, else test docs)
  std::optional<std::vector<Json>> samples;
  Json doc_to_text, doc_to_target, doc_to_choice;
  std::string target_delimiter = " ", fewshot_delimiter = "\n\n";
};

struct TaskConfig {
  std::filesystem::path file;
  Json raw;  // the task file as read (include merged), for the results' "config"
  std::string name, output_type, dataset_path;
  std::map<std::string, std::vector<Json>> splits;
  std::string training_split, validation_split, test_split, fewshot_split;
  Json doc_to_text, doc_to_target, doc_to_choice;
  std::string description, target_delimiter = " ", fewshot_delimiter = "\n\n";
  std::optional<int64_t> num_fewshot;
  FewshotConfig fewshot;
  Json generation_kwargs;
  std::vector<std::string> until;
  int64_t max_gen_toks = 256;
  std::vector<MetricConfig> metrics;
  std::vector<FilterConfig> filters;
  Json version = nullptr;
  TaskOptions options;
};

TaskConfig read_task_config(const std::filesystem::path& file);

}  // namespace trainrun::eval
