// Reading lm-eval YAML task files and their local data (harness.hpp lists what a task may say).
// YAML scalars are typed as PyYAML's loader types them (lm-eval reads tasks with yaml), so that
// `num_fewshot: 3` is a number and `doc_to_target: "3"` a string.
#include "task_config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "trainrun/error.hpp"

namespace fs = std::filesystem;

namespace trainrun::eval {

using v1::ConfigError;

namespace {

// A plain (unquoted) YAML 1.1 scalar as PyYAML resolves it: null, bool, int, float or string.
Json plain_scalar(const std::string& s) {
  static const std::regex null_re("^(~|null|Null|NULL|)$");
  static const std::regex true_re("^(yes|Yes|YES|true|True|TRUE|on|On|ON)$");
  static const std::regex false_re("^(no|No|NO|false|False|FALSE|off|Off|OFF)$");
  static const std::regex int_re("^[-+]?(0|[1-9][0-9_]*)$");
  static const std::regex float_re(
      "^[-+]?([0-9][0-9_]*)?\\.[0-9_]*([eE][-+][0-9]+)?$|^[-+]?[0-9][0-9_]*([eE][-+][0-9]+)$");
  if (std::regex_match(s, null_re)) return nullptr;
  if (std::regex_match(s, true_re)) return true;
  if (std::regex_match(s, false_re)) return false;
  std::string digits;
  for (char c : s)
    if (c != '_') digits += c;
  if (std::regex_match(s, int_re)) return std::stoll(digits);
  if (std::regex_match(s, float_re) && s != "." && s != "-." && s != "+.") return std::stod(digits);
  return s;
}

Json to_json(const YAML::Node& n, const std::string& where) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return nullptr;
    case YAML::NodeType::Scalar: {
      const std::string& tag = n.Tag();
      if (tag == "!function" || tag == "!!python/name")
        throw ConfigError(where + ": a Python function (" + tag + " " + n.Scalar() +
                          ") cannot be run by trainrun eval; write it as a template or field");
      if (tag == "?") return plain_scalar(n.Scalar());
      return n.Scalar();
    }
    case YAML::NodeType::Sequence: {
      Json a = Json::array();
      for (size_t i = 0; i < n.size(); ++i)
        a.push_back(to_json(n[i], where + "[" + std::to_string(i) + "]"));
      return a;
    }
    case YAML::NodeType::Map: {
      Json o = Json::object();
      for (const auto& kv : n) {
        const std::string key = kv.first.Scalar();
        o[key] = to_json(kv.second, where + "." + key);
      }
      return o;
    }
  }
  return nullptr;
}

Json read_yaml(const fs::path& file, int depth) {
  if (depth > 8) throw ConfigError(file.string() + ": `include` nests more than 8 deep");
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::BadFile&) {
    throw ConfigError(file.string() + ": cannot be read");
  } catch (const YAML::Exception& e) {
    throw ConfigError(file.string() + ", line " + std::to_string(e.mark.line + 1) +
                      ": not valid YAML: " + e.msg);
  }
  if (!root.IsMap()) throw ConfigError(file.string() + ": a task file must be a YAML mapping");
  Json j = to_json(root, file.string());
  if (j.contains("include")) {
    if (!j["include"].is_string())
      throw ConfigError(file.string() + ": `include` must name a YAML file");
    fs::path inc = j["include"].get<std::string>();
    if (inc.is_relative()) inc = file.parent_path() / inc;
    Json base = read_yaml(inc, depth + 1);
    j.erase("include");
    for (auto it = j.begin(); it != j.end(); ++it) base[it.key()] = it.value();
    return base;
  }
  return j;
}

const std::set<std::string>& known_keys() {
  static const std::set<std::string> keys = {"task",
                                             "task_alias",
                                             "tag",
                                             "dataset_path",
                                             "dataset_name",
                                             "dataset_kwargs",
                                             "training_split",
                                             "validation_split",
                                             "test_split",
                                             "fewshot_split",
                                             "fewshot_config",
                                             "doc_to_text",
                                             "doc_to_target",
                                             "doc_to_choice",
                                             "description",
                                             "target_delimiter",
                                             "fewshot_delimiter",
                                             "num_fewshot",
                                             "output_type",
                                             "generation_kwargs",
                                             "metric_list",
                                             "filter_list",
                                             "repeats",
                                             "metadata",
                                             "should_decontaminate",
                                             "gen_prefix"};
  return keys;
}

std::string str_or(const Json& j, const char* key, const std::string& dflt,
                   const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_string()) throw ConfigError(where + ": `" + key + "` must be a string");
  return j[key].get<std::string>();
}

// A CSV cell as pandas would type it when every cell of its column parses so: int, then float.
Json csv_column_value(const std::string& s, bool all_int, bool all_float) {
  if (all_int) return std::stoll(s);
  if (all_float) return std::stod(s);
  return s;
}

std::vector<std::string> csv_row(const std::string& line, std::istream& in, int& lineno) {
  std::vector<std::string> cells;
  std::string cell, rest = line;
  bool quoted = false;
  for (size_t i = 0;; ++i) {
    if (i == rest.size()) {
      if (quoted) {
        std::string more;
        if (!std::getline(in, more)) break;
        ++lineno;
        rest += "\n" + more;
      } else {
        break;
      }
    }
    if (i >= rest.size()) break;
    const char c = rest[i];
    if (quoted) {
      if (c == '"' && i + 1 < rest.size() && rest[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.push_back(cell);
      cell.clear();
    } else if (c != '\r') {
      cell += c;
    }
  }
  cells.push_back(cell);
  return cells;
}

std::vector<Json> read_csv(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot be read");
  std::string line;
  int lineno = 1;
  if (!std::getline(in, line)) throw ConfigError(file.string() + ": empty CSV file");
  const std::vector<std::string> header = csv_row(line, in, lineno);
  std::vector<std::vector<std::string>> rows;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty()) continue;
    std::vector<std::string> r = csv_row(line, in, lineno);
    if (r.size() != header.size())
      throw ConfigError(file.string() + ", line " + std::to_string(lineno) + ": " +
                        std::to_string(r.size()) + " cells where the header has " +
                        std::to_string(header.size()));
    rows.push_back(std::move(r));
  }
  static const std::regex int_re("^[-+]?[0-9]+$");
  static const std::regex float_re("^[-+]?([0-9]+\\.?[0-9]*|\\.[0-9]+)([eE][-+]?[0-9]+)?$");
  std::vector<bool> all_int(header.size(), !rows.empty()), all_float(header.size(), !rows.empty());
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) {
      all_int[c] = all_int[c] && std::regex_match(r[c], int_re);
      all_float[c] = all_float[c] && std::regex_match(r[c], float_re);
    }
  std::vector<Json> docs;
  for (const auto& r : rows) {
    Json d = Json::object();
    for (size_t c = 0; c < r.size(); ++c)
      d[header[c]] = csv_column_value(r[c], all_int[c], all_float[c]);
    docs.push_back(std::move(d));
  }
  return docs;
}

std::vector<Json> read_json_docs(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  // A JSON array (or one object holding rows) first; else JSON Lines, as datasets' json loader.
  size_t first = all.find_first_not_of(" \t\r\n");
  std::vector<Json> docs;
  if (first != std::string::npos && all[first] == '[') {
    Json a;
    try {
      a = Json::parse(all);
    } catch (const Json::exception& e) {
      throw ConfigError(file.string() + ": not valid JSON: " + e.what());
    }
    for (auto& d : a) docs.push_back(d);
  } else {
    std::istringstream lines(all);
    std::string line;
    for (int n = 1; std::getline(lines, line); ++n) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      try {
        docs.push_back(Json::parse(line));
      } catch (const Json::exception& e) {
        throw ConfigError(file.string() + ", line " + std::to_string(n) +
                          ": not valid JSON: " + e.what());
      }
    }
  }
  for (size_t i = 0; i < docs.size(); ++i)
    if (!docs[i].is_object())
      throw ConfigError(file.string() + ": row " + std::to_string(i + 1) + " is not a JSON object");
  // datasets gives every row every column (null where a row lacks it).
  std::vector<std::string> columns;
  for (const auto& d : docs)
    for (auto it = d.begin(); it != d.end(); ++it)
      if (std::find(columns.begin(), columns.end(), it.key()) == columns.end())
        columns.push_back(it.key());
  for (auto& d : docs) {
    Json full = Json::object();
    for (const auto& c : columns) full[c] = d.contains(c) ? d[c] : Json(nullptr);
    d = std::move(full);
  }
  return docs;
}

}  // namespace

TaskConfig read_task_config(const fs::path& file) {
  TaskConfig c;
  c.file = file;
  const std::string where = file.string();
  c.raw = read_yaml(file, 0);
  const Json& j = c.raw;
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known_keys().count(it.key()))
      throw ConfigError(where + ": unknown or unsupported key `" + it.key() + "`");
  if (!j.contains("task") || !j["task"].is_string())
    throw ConfigError(where + ": `task` (the task's name) is required and must be a string");
  c.name = j["task"].get<std::string>();
  c.output_type = str_or(j, "output_type", "generate_until", where);
  static const std::set<std::string> types = {"multiple_choice", "loglikelihood",
                                              "loglikelihood_rolling", "generate_until"};
  if (!types.count(c.output_type))
    throw ConfigError(where + ": output_type `" + c.output_type +
                      "` is not one of multiple_choice, loglikelihood, loglikelihood_rolling, "
                      "generate_until");
  c.dataset_path = str_or(j, "dataset_path", "", where);
  if (c.dataset_path != "json" && c.dataset_path != "csv")
    throw ConfigError(where + ": dataset_path `" + c.dataset_path +
                      "`: trainrun eval reads local files only (dataset_path: json or csv, "
                      "with dataset_kwargs.data_files naming them); no hub here");
  if (j.contains("dataset_name") && !j["dataset_name"].is_null())
    throw ConfigError(where + ": dataset_name is for hub datasets; give data_files instead");
  const Json files = j.value("dataset_kwargs", Json::object()).value("data_files", Json());
  if (!files.is_object() || files.empty())
    throw ConfigError(where + ": dataset_kwargs.data_files must map split names to files");
  for (auto it = files.begin(); it != files.end(); ++it) {
    std::vector<std::string> paths;
    if (it.value().is_string())
      paths.push_back(it.value().get<std::string>());
    else if (it.value().is_array())
      for (const auto& p : it.value()) paths.push_back(p.get<std::string>());
    else
      throw ConfigError(where + ": dataset_kwargs.data_files." + it.key() +
                        " must be a file or a list of files");
    std::vector<Json>& split = c.splits[it.key()];
    for (const std::string& p : paths) {
      // As datasets resolves it (the working directory); failing that, beside the task file.
      fs::path f = p;
      if (f.is_relative() && !fs::exists(f)) f = file.parent_path() / p;
      if (!fs::exists(f))
        throw ConfigError(where + ": data file `" + p + "` (split " + it.key() +
                          ") does not exist");
      std::vector<Json> docs = c.dataset_path == "csv" ? read_csv(f) : read_json_docs(f);
      split.insert(split.end(), docs.begin(), docs.end());
    }
  }
  auto split_key = [&](const char* key) {
    const std::string s = str_or(j, key, "", where);
    if (!s.empty() && !c.splits.count(s))
      throw ConfigError(where + ": " + key + " `" + s + "` is not among data_files' splits");
    return s;
  };
  c.training_split = split_key("training_split");
  c.validation_split = split_key("validation_split");
  c.test_split = split_key("test_split");
  c.fewshot_split = split_key("fewshot_split");
  if (c.test_split.empty() && c.validation_split.empty())
    throw ConfigError(where + ": no test_split or validation_split to evaluate");
  const std::string& eval_split = c.test_split.empty() ? c.validation_split : c.test_split;
  if (c.splits[eval_split].empty())
    throw ConfigError(where + ": split `" + eval_split + "` has no documents");

  c.doc_to_text = j.value("doc_to_text", Json(nullptr));
  c.doc_to_target = j.value("doc_to_target", Json(nullptr));
  c.doc_to_choice = j.value("doc_to_choice", Json(nullptr));
  c.description = str_or(j, "description", "", where);
  c.target_delimiter = str_or(j, "target_delimiter", " ", where);
  c.fewshot_delimiter = str_or(j, "fewshot_delimiter", "\n\n", where);
  if (j.contains("gen_prefix") && !j["gen_prefix"].is_null())
    throw ConfigError(where + ": gen_prefix is not supported yet");
  if (j.contains("repeats") && j["repeats"] != Json(1))
    throw ConfigError(where + ": repeats other than 1 is not supported");
  if (j.contains("num_fewshot") && !j["num_fewshot"].is_null()) {
    if (!j["num_fewshot"].is_number_integer() || j["num_fewshot"].get<int64_t>() < 0)
      throw ConfigError(where + ": num_fewshot must be a non-negative integer");
    c.num_fewshot = j["num_fewshot"].get<int64_t>();
  }
  // fewshot_config: the sampler and overrides of the few-shot examples' fields.
  c.fewshot.split = c.fewshot_split;
  c.fewshot.doc_to_text = c.doc_to_text;
  c.fewshot.doc_to_target = c.doc_to_target;
  c.fewshot.doc_to_choice = c.doc_to_choice;
  c.fewshot.target_delimiter = c.target_delimiter;
  c.fewshot.fewshot_delimiter = c.fewshot_delimiter;
  if (j.contains("fewshot_config") && !j["fewshot_config"].is_null()) {
    const Json& f = j["fewshot_config"];
    const std::string fw = where + ": fewshot_config";
    if (!f.is_object()) throw ConfigError(fw + " must be a mapping");
    for (auto it = f.begin(); it != f.end(); ++it) {
      const std::string& k = it.key();
      if (k == "sampler")
        c.fewshot.sampler = str_or(f, "sampler", "default", fw);
      else if (k == "split")
        c.fewshot.split = str_or(f, "split", "", fw);
      else if (k == "doc_to_text")
        c.fewshot.doc_to_text = it.value();
      else if (k == "doc_to_target")
        c.fewshot.doc_to_target = it.value();
      else if (k == "doc_to_choice")
        c.fewshot.doc_to_choice = it.value();
      else if (k == "target_delimiter")
        c.fewshot.target_delimiter = str_or(f, "target_delimiter", " ", fw);
      else if (k == "fewshot_delimiter")
        c.fewshot.fewshot_delimiter = str_or(f, "fewshot_delimiter", "\n\n", fw);
      else if (k == "samples") {
        if (!it.value().is_array()) throw ConfigError(fw + ".samples must be a list of documents");
        c.fewshot.samples = std::vector<Json>(it.value().begin(), it.value().end());
      } else
        throw ConfigError(fw + ": unknown or unsupported key `" + k + "`");
    }
    if (c.fewshot.sampler != "default" && c.fewshot.sampler != "first_n")
      throw ConfigError(fw + ".sampler `" + c.fewshot.sampler + "`: expected default or first_n");
    if (!c.fewshot.split.empty() && !c.splits.count(c.fewshot.split))
      throw ConfigError(fw + ".split `" + c.fewshot.split + "` is not among data_files' splits");
  }

  // generation_kwargs, with lm-eval's defaults (until: the few-shot delimiter).
  if (c.output_type == "generate_until") {
    c.generation_kwargs = j.value("generation_kwargs", Json(nullptr));
    if (c.generation_kwargs.is_null())
      c.generation_kwargs =
          Json{{"until", Json::array({c.fewshot_delimiter})}, {"do_sample", false}};
    if (!c.generation_kwargs.is_object())
      throw ConfigError(where + ": generation_kwargs must be a mapping");
    Json& g = c.generation_kwargs;
    if (!g.contains("until")) g["until"] = Json::array({c.fewshot_delimiter});
    if (g["until"].is_string())
      c.until = {g["until"].get<std::string>()};
    else if (g["until"].is_array())
      for (const auto& u : g["until"]) {
        if (!u.is_string()) throw ConfigError(where + ": generation_kwargs.until must be strings");
        c.until.push_back(u.get<std::string>());
      }
    else
      throw ConfigError(where + ": generation_kwargs.until must be a string or a list of them");
    for (const char* k : {"max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens"})
      if (g.contains(k)) {
        if (!g[k].is_number_integer() || g[k].get<int64_t>() < 1)
          throw ConfigError(where + ": generation_kwargs." + k + " must be a positive integer");
        c.max_gen_toks = g[k].get<int64_t>();
        break;
      }
    const bool sample = g.value("do_sample", false);
    const double temperature = g.contains("temperature") && g["temperature"].is_number()
                                   ? g["temperature"].get<double>()
                                   : 0.0;
    if (sample && temperature != 0.0)
      throw ConfigError(where +
                        ": generation_kwargs: sampling (do_sample: true) is not "
                        "supported; trainrun eval decodes greedily");
    for (auto it = g.begin(); it != g.end(); ++it) {
      static const std::set<std::string> ok = {
          "until",     "max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens",
          "do_sample", "temperature"};
      if (!ok.count(it.key()))
        throw ConfigError(where + ": generation_kwargs." + it.key() + " is not supported");
    }
  } else if (j.contains("generation_kwargs") && !j["generation_kwargs"].is_null()) {
    throw ConfigError(where + ": generation_kwargs is for output_type generate_until");
  }

  // metric_list; by default lm-eval's per output type.
  const Json metrics = j.value("metric_list", Json(nullptr));
  static const std::map<std::string, std::pair<std::string, bool>> defaults = {
      {"acc", {"mean", true}},
      {"acc_norm", {"mean", true}},
      {"acc_bytes", {"mean", true}},
      {"exact_match", {"mean", true}},
      {"perplexity", {"perplexity", false}},
      {"word_perplexity", {"weighted_perplexity", false}},
      {"byte_perplexity", {"weighted_perplexity", false}},
      {"bits_per_byte", {"bits_per_byte", false}}};
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"multiple_choice", {"acc", "acc_norm", "acc_bytes", "exact_match"}},
      {"loglikelihood", {"acc", "perplexity"}},
      {"loglikelihood_rolling", {"word_perplexity", "byte_perplexity", "bits_per_byte"}},
      {"generate_until", {"exact_match"}}};
  if (metrics.is_null()) {
    std::vector<std::string> names;
    if (c.output_type == "multiple_choice")
      names = {"acc", "acc_norm"};
    else if (c.output_type == "loglikelihood")
      names = {"perplexity", "acc"};
    else if (c.output_type == "loglikelihood_rolling")
      names = {"word_perplexity", "byte_perplexity", "bits_per_byte"};
    else
      names = {"exact_match"};
    for (const auto& n : names)
      c.metrics.push_back({n, defaults.at(n).first, defaults.at(n).second, Json::object()});
  } else {
    if (!metrics.is_array()) throw ConfigError(where + ": metric_list must be a list");
    for (size_t i = 0; i < metrics.size(); ++i) {
      const Json& m = metrics[i];
      const std::string mw = where + ": metric_list[" + std::to_string(i) + "]";
      if (!m.is_object() || !m.contains("metric") || !m["metric"].is_string())
        throw ConfigError(mw + " needs `metric` (a metric's name)");
      MetricConfig mc;
      mc.name = m["metric"].get<std::string>();
      if (!defaults.count(mc.name))
        throw ConfigError(mw + ": unknown metric `" + mc.name +
                          "` (trainrun eval knows acc, acc_norm, acc_bytes, exact_match, "
                          "perplexity, word_perplexity, byte_perplexity, bits_per_byte)");
      if (!allowed.at(c.output_type).count(mc.name))
        throw ConfigError(mw + ": metric `" + mc.name + "` does not apply to output_type " +
                          c.output_type);
      mc.aggregation =
          m.contains("aggregation") ? str_or(m, "aggregation", "", mw) : defaults.at(mc.name).first;
      static const std::set<std::string> aggs = {"mean", "perplexity", "weighted_perplexity",
                                                 "bits_per_byte"};
      if (!aggs.count(mc.aggregation))
        throw ConfigError(mw + ": unknown aggregation `" + mc.aggregation + "`");
      mc.higher_is_better = m.contains("higher_is_better") && m["higher_is_better"].is_boolean()
                                ? m["higher_is_better"].get<bool>()
                                : defaults.at(mc.name).second;
      for (auto it = m.begin(); it != m.end(); ++it) {
        const std::string& k = it.key();
        if (k == "metric" || k == "aggregation" || k == "higher_is_better") continue;
        static const std::set<std::string> em = {"ignore_case", "ignore_punctuation",
                                                 "ignore_numbers", "regexes_to_ignore"};
        if (mc.name != "exact_match" || !em.count(k))
          throw ConfigError(mw + ": option `" + k + "` is not supported for " + mc.name);
        mc.kwargs[k] = it.value();
      }
      c.metrics.push_back(std::move(mc));
    }
  }

  // filter_list: named pipelines; the default is one "none" pipeline taking the first answer.
  const Json filters = j.value("filter_list", Json(nullptr));
  if (filters.is_null()) {
    c.filters.push_back({"none", {Json{{"function", "take_first"}}}});
  } else {
    if (!filters.is_array()) throw ConfigError(where + ": filter_list must be a list");
    for (size_t i = 0; i < filters.size(); ++i) {
      const Json& f = filters[i];
      const std::string fw = where + ": filter_list[" + std::to_string(i) + "]";
      if (!f.is_object() || !f.contains("name") || !f.contains("filter") || !f["filter"].is_array())
        throw ConfigError(fw + " needs `name` and `filter` (a list of functions)");
      FilterConfig fc;
      fc.name = f["name"].get<std::string>();
      for (const auto& step : f["filter"]) {
        static const std::set<std::string> fns = {"regex", "take_first", "remove_whitespace",
                                                  "lowercase", "uppercase"};
        const std::string fn = step.value("function", std::string());
        if (!fns.count(fn))
          throw ConfigError(fw + ": filter function `" + fn +
                            "` is not supported (regex, take_first, remove_whitespace, "
                            "lowercase, uppercase)");
        fc.steps.push_back(step);
      }
      c.filters.push_back(std::move(fc));
    }
  }
  if (j.contains("metadata") && j["metadata"].is_object() && j["metadata"].contains("version"))
    c.version = j["metadata"]["version"];
  return c;
}

}  // namespace trainrun::eval
