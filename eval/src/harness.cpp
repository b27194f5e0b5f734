// Tasks -> requests -> metrics, as lm-eval 0.4.13's ConfigurableTask and evaluator do them
// (harness.hpp). The rules followed, by lm-eval function: fewshot_context/build_qa_turn (the
// description, then each example as text + target_delimiter + answer + fewshot_delimiter, then
// the document's text), doc_to_text/doc_to_target/doc_to_choice (a field, else a rendered
// template; digits become an index when the task has choices), construct_requests,
// process_results, the metrics' aggregations and mean_stderr.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <openssl/evp.h>
#include <pcre2.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <cmath>
#include <map>
#include <set>

#include "task_config.hpp"
#include "trainrun/error.hpp"
#include "trainrun/text/chat_template.hpp"

namespace fs = std::filesystem;

namespace trainrun::eval {

using v1::ConfigError;

namespace {

// ---- Python's string semantics -----------------------------------------------------------

// Code points of UTF-8 `s` (invalid bytes count as one each).
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + len > s.size()) len = 1;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += len;
  }
  return out;
}

// str.isspace() of one code point (Unicode White_Space plus the separators Python adds).
bool py_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

}  // namespace

size_t trailing_whitespace_bytes(const std::string& s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    const std::vector<uint32_t> cp = code_points(s.substr(start, end - start));
    if (cp.size() != 1 || !py_space(cp[0])) break;
    end = start;
  }
  return s.size() - end;
}

namespace {

bool py_isdigit(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Python's str.strip().
std::string py_strip(const std::string& s) {
  std::string r = s.substr(0, s.size() - trailing_whitespace_bytes(s));
  size_t b = 0;
  while (b < r.size()) {
    size_t e = b + 1;
    while (e < r.size() && (static_cast<unsigned char>(r[e]) & 0xc0) == 0x80) ++e;
    const std::vector<uint32_t> cp = code_points(r.substr(b, e - b));
    if (cp.size() != 1 || !py_space(cp[0])) break;
    b = e;
  }
  return r.substr(b);
}

// len(re.split(r"\s+", text)): one more than the runs of whitespace.
int64_t count_words(const std::string& text) {
  int64_t runs = 0;
  bool in_space = false;
  for (uint32_t c : code_points(text)) {
    const bool sp = py_space(c);
    if (sp && !in_space) ++runs;
    in_space = sp;
  }
  return runs + 1;
}

// ast.literal_eval of what a template rendered (a list's Python repr, "['a', 'b']"): read back
// as a Jinja expression, whose literals are Python's (quotes, escapes, True/False/None, tuples),
// and written out as JSON.
Json literal_eval(const std::string& s) {
  try {
    const text::ChatTemplate t("{{ (" + s + ") | tojson }}", Json::object(), "literal");
    return Json::parse(t.render(Json::object()).text);
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());
  }
}

// ---- templates ---------------------------------------------------------------------------

// The names a template's {{ }} expressions start from, to refuse an undefined one as lm-eval's
// StrictUndefined does (trainrun's engine renders an undefined variable as empty).
std::vector<std::string> root_names(const std::string& t) {
  static const std::set<std::string> words = {"and",  "or",   "not",   "in",        "is",   "if",
                                              "else", "true", "false", "none",      "True", "False",
                                              "None", "loop", "range", "namespace", "dict"};
  std::vector<std::string> names;
  for (size_t p = t.find("{{"); p != std::string::npos; p = t.find("{{", p)) {
    const size_t e = t.find("}}", p);
    if (e == std::string::npos) break;
    const std::string x = t.substr(p + 2, e - p - 2);
    char quote = 0;
    char prev = 0;  // last non-space character outside identifiers
    for (size_t i = 0; i < x.size();) {
      const char c = x[i];
      if (quote) {
        if (c == '\\')
          ++i;
        else if (c == quote)
          quote = 0;
        ++i;
        continue;
      }
      if (c == '\'' || c == '"') {
        quote = c;
        ++i;
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < x.size() && (std::isalnum(static_cast<unsigned char>(x[j])) || x[j] == '_')) ++j;
        const std::string id = x.substr(i, j - i);
        if (prev != '.' && prev != '|' && !words.count(id)) names.push_back(id);
        prev = 'a';
        // `is` tests name a test, not a variable.
        if (id == "is") prev = '|';
        i = j;
        continue;
      }
      if (!std::isspace(static_cast<unsigned char>(c))) prev = c;
      if (std::isdigit(static_cast<unsigned char>(c))) prev = 'a';
      ++i;
    }
    p = e;
  }
  return names;
}

class Templates {
 public:
  std::string render(const std::string& source, const Json& doc, const std::string& what) {
    if (source.find("{%") != std::string::npos || source.find("{#") != std::string::npos)
      throw ConfigError(what +
                        ": the template uses {% %} or {# #}; trainrun eval renders "
                        "lm-eval templates made of text and {{ }} expressions only");
    for (const std::string& n : root_names(source))
      if (!doc.contains(n))
        throw ConfigError(what + ": the template refers to `" + n +
                          "`, which the document does not have (its fields: " + fields(doc) + ")");
    auto it = cache_.find(source);
    if (it == cache_.end()) {
      // lm-eval's environment keeps a final newline (keep_trailing_newline); ending the source
      // with an empty expression keeps it here.
      const std::string src =
          !source.empty() && source.back() == '\n' ? source + "{{ '' }}" : source;
      try {
        it = cache_.emplace(source, std::make_unique<text::ChatTemplate>(src, Json::object(), what))
                 .first;
      } catch (const text::ChatTemplateError& e) {
        throw ConfigError(e.what());
      }
    }
    try {
      return it->second->render(doc).text;
    } catch (const text::ChatTemplateError& e) {
      throw ConfigError(what + ": " + e.message());
    }
  }
  static std::string fields(const Json& doc) {
    std::string s;
    for (auto it = doc.begin(); it != doc.end(); ++it) s += (s.empty() ? "" : ", ") + it.key();
    return s;
  }

 private:
  std::map<std::string, std::unique_ptr<text::ChatTemplate>> cache_;
};

// ---- regexes (Python's re on the patterns tasks use, through PCRE2 in UTF mode) -------------

class Regex {
 public:
  Regex(const std::string& pattern, const std::string& what) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR buf[256];
      pcre2_get_error_message(err, buf, sizeof buf);
      throw ConfigError(what + ": regex `" + pattern + "` at offset " + std::to_string(off) + ": " +
                        reinterpret_cast<char*>(buf));
    }
    pcre2_pattern_info(code_, PCRE2_INFO_CAPTURECOUNT, &groups_);
  }
  Regex(const Regex&) = delete;
  ~Regex() { pcre2_code_free(code_); }

  // re.findall: each match's whole text (no groups), group 1 (one group) or every group.
  std::vector<std::vector<std::string>> findall(const std::string& s) const {
    std::vector<std::vector<std::string>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0,
                                 md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      std::vector<std::string> m;
      if (groups_ == 0) m.push_back(s.substr(ov[0], ov[1] - ov[0]));
      for (uint32_t g = 1; g <= groups_; ++g)
        m.push_back(ov[2 * g] == PCRE2_UNSET ? std::string()
                                             : s.substr(ov[2 * g], ov[2 * g + 1] - ov[2 * g]));
      out.push_back(std::move(m));
      if (ov[1] == ov[0]) {
        if (ov[1] >= s.size()) break;
        start = ov[1] + 1;
        while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) ++start;
      } else {
        start = ov[1];
      }
    }
    pcre2_match_data_free(md);
    return out;
  }
  // re.sub(pattern, "", s).
  std::string remove(const std::string& s) const {
    std::string out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t start = 0, copied = 0;
    while (start <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), start, 0,
                                 md, nullptr);
      if (rc < 0) break;
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      out += s.substr(copied, ov[0] - copied);
      copied = ov[1];
      if (ov[1] == ov[0]) {
        if (ov[1] >= s.size()) break;
        start = ov[1] + 1;
      } else {
        start = ov[1];
      }
    }
    out += s.substr(std::min(copied, s.size()));
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
  uint32_t groups_ = 0;
};

// hashlib.sha256(s.encode()).hexdigest(), as lm-eval's hash_string.
std::string sha256_hex(const std::string& s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(s.data(), s.size(), md, &len, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

// json.dumps(v, indent=2, ensure_ascii=False) for the documents of data files (strings, numbers,
// lists, objects); nlohmann writes the same layout and escapes.
std::string python_json_dumps(const Json& v) {
  return v.dump(2, ' ', false, Json::error_handler_t::replace);
}

// str(v) of a target: the text itself, or the number / list as Python prints it.
std::string python_str(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_null()) return "None";
  if (v.is_array()) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i) s += ", ";
      s += v[i].is_string() ? "'" + v[i].get<std::string>() + "'" : python_str(v[i]);
    }
    return s + "]";
  }
  return v.dump();
}

// Python's str.lower()/upper() through the template engine (which follows Python's Unicode
// case mappings).
std::string py_case(const std::string& s, bool lower) {
  static const text::ChatTemplate lo("{{ s.lower() }}"), up("{{ s.upper() }}");
  return (lower ? lo : up).render(Json{{"s", s}}).text;
}

}  // namespace

// ---- Task ---------------------------------------------------------------------------------

namespace {

std::string doc_where(const TaskConfig& c, int64_t doc_id, const char* field) {
  return "task " + c.name + " (" + c.file.string() + "), document " + std::to_string(doc_id) +
         ", " + field;
}

// doc_to_text / doc_to_target / doc_to_choice of lm-eval.
Json doc_to(const TaskConfig& c, Templates& t, const Json& doc, const Json& spec, const char* field,
            int64_t doc_id) {
  const std::string where = doc_where(c, doc_id, field);
  const bool has_choices = !c.doc_to_choice.is_null();
  const std::string f = field;
  if (spec.is_null()) throw ConfigError(where + ": the task does not set " + f);
  if (spec.is_number_integer() && f != "doc_to_choice") return spec;
  if (spec.is_array() && f != "doc_to_text") return spec;
  if (spec.is_object() && f == "doc_to_choice") {
    Json a = Json::array();
    for (auto it = spec.begin(); it != spec.end(); ++it) a.push_back(it.value());
    return a;
  }
  if (!spec.is_string()) throw ConfigError(where + ": must be a field name or a template");
  const std::string s = spec.get<std::string>();
  if (doc.contains(s)) return doc[s];
  const std::string r = t.render(s, doc, where);
  if (f == "doc_to_choice") {
    try {
      return literal_eval(r);
    } catch (const std::exception& e) {
      throw ConfigError(where + ": the template gave `" + r + "`, not a Python list literal (" +
                        e.what() + ")");
    }
  }
  if (py_isdigit(r) && has_choices) return std::stoll(r);
  if (f == "doc_to_target" && r.size() >= 2 && r.front() == '[' && r.back() == ']') {
    try {
      return literal_eval(r);
    } catch (const std::exception&) {
      return r;
    }
  }
  return r;
}

std::vector<std::string> choices_of(const Json& v, const std::string& where) {
  if (!v.is_array()) throw ConfigError(where + ": doc_to_choice must give a list");
  std::vector<std::string> out;
  for (const auto& x : v) {
    if (!x.is_string()) throw ConfigError(where + ": doc_to_choice must give a list of strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

// build_qa_turn as plain text: the question, its delimiter, the answer and its delimiter.
std::string qa_text(const Json& q, const Json& c, const Json& a, const std::string& tgt_delim,
                    const std::string& few_delim, const std::string& where) {
  if (!q.is_string()) throw ConfigError(where + ": doc_to_text must give a string");
  const bool has_answer = !a.is_null() && !(a.is_string() && a.get<std::string>().empty());
  std::string out = q.get<std::string>();
  if (!has_answer) return out;
  out += tgt_delim;
  Json answer = a;
  if (c.is_array() && !c.empty() && a.is_number_integer()) {
    const int64_t k = a.get<int64_t>();
    if (k < 0 || k >= static_cast<int64_t>(c.size()))
      throw ConfigError(where + ": target index " + std::to_string(k) + " is not among the " +
                        std::to_string(c.size()) + " choices");
    answer = c[k];
  } else if (a.is_array()) {
    answer = a.empty() ? Json("") : a[0];
  }
  if (!answer.is_string())
    throw ConfigError(where + ": the answer is not a string: " + answer.dump());
  return out + answer.get<std::string>() + few_delim;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

}  // namespace

Task::Task() = default;
Task::Task(Task&&) noexcept = default;
Task& Task::operator=(Task&&) noexcept = default;
Task::~Task() = default;

Task Task::load(const fs::path& file, const TaskOptions& options) {
  Task t;
  t.config_ = std::make_unique<TaskConfig>(read_task_config(file));
  t.config_->options = options;
  if (options.num_fewshot) t.config_->num_fewshot = options.num_fewshot;
  t.docs_ = std::make_unique<std::vector<DocRequests>>();
  return t;
}

const std::string& Task::name() const { return config_->name; }

std::vector<DocRequests>& Task::build() {
  TaskConfig& c = *config_;
  static thread_local Templates templates;
  const std::vector<Json>& eval_docs =
      c.splits.at(c.test_split.empty() ? c.validation_split : c.test_split);
  int64_t n = static_cast<int64_t>(eval_docs.size());
  if (c.options.limit) n = std::min(n, *c.options.limit);
  const int64_t shots = c.num_fewshot.value_or(0);
  // The few-shot pool: fewshot split, else samples, else training, validation, test docs.
  std::vector<Json> pool;
  if (!c.fewshot.split.empty())
    pool = c.splits.at(c.fewshot.split);
  else if (c.fewshot.samples)
    pool = *c.fewshot.samples;
  else if (!c.training_split.empty())
    pool = c.splits.at(c.training_split);
  else if (!c.validation_split.empty())
    pool = c.splits.at(c.validation_split);
  else
    pool = c.splits.at(c.test_split);
  // lm-eval leaves the document out of its own examples when the few-shot split is the test
  // split (both unset counts as equal, as None == None there).
  const bool same_split = c.fewshot.split == c.test_split;
  PythonRandom rnd(static_cast<uint64_t>(c.options.fewshot_seed));
  docs_->clear();
  for (int64_t id = 0; id < n; ++id) {
    const Json& doc = eval_docs[id];
    std::string ctx;
    if (!c.description.empty())
      ctx = doc.contains(c.description)
                ? doc[c.description].get<std::string>()
                : templates.render(c.description, doc, doc_where(c, id, "description"));
    if (shots > 0) {
      std::vector<Json> examples;
      if (c.fewshot.sampler == "first_n") {
        for (const Json& d : pool) {
          if (same_split && d == doc) continue;
          if (static_cast<int64_t>(examples.size()) == shots) break;
          examples.push_back(d);
        }
        if (static_cast<int64_t>(examples.size()) < shots)
          throw ConfigError("task " + c.name + ": " + std::to_string(shots) +
                            " few-shot examples asked, the pool has " +
                            std::to_string(examples.size()));
      } else {
        const int64_t draw = same_split ? shots + 1 : shots;
        if (draw > static_cast<int64_t>(pool.size()))
          throw ConfigError("task " + c.name + ": " + std::to_string(shots) +
                            " few-shot examples asked, the pool has " +
                            std::to_string(pool.size()) + " documents" +
                            (same_split ? " (one of them the document itself)" : ""));
        for (int64_t k : rnd.sample(static_cast<int64_t>(pool.size()), draw)) {
          if (same_split && pool[k] == doc) continue;
          if (static_cast<int64_t>(examples.size()) < shots) examples.push_back(pool[k]);
        }
        if (static_cast<int64_t>(examples.size()) < shots) {
          std::vector<int64_t> rest;
          for (size_t k = 0; k < pool.size(); ++k)
            if (pool[k] != doc) rest.push_back(static_cast<int64_t>(k));
          examples.clear();
          for (int64_t k : rnd.sample(static_cast<int64_t>(rest.size()), shots))
            examples.push_back(pool[rest[k]]);
        }
      }
      for (const Json& fs_doc : examples) {
        const std::string where = doc_where(c, id, "few-shot example");
        const Json q = doc_to(c, templates, fs_doc, c.fewshot.doc_to_text, "doc_to_text", id);
        const Json ch =
            c.fewshot.doc_to_choice.is_null()
                ? Json(nullptr)
                : doc_to(c, templates, fs_doc, c.fewshot.doc_to_choice, "doc_to_choice", id);
        const Json a = doc_to(c, templates, fs_doc, c.fewshot.doc_to_target, "doc_to_target", id);
        ctx += qa_text(q, ch, a, c.fewshot.target_delimiter, c.fewshot.fewshot_delimiter, where);
      }
    }
    const Json q = doc_to(c, templates, doc, c.doc_to_text, "doc_to_text", id);
    if (q.is_number_integer())
      throw ConfigError(doc_where(c, id, "doc_to_text") +
                        ": gives an index (a multiple-input task, as winogrande); not supported "
                        "yet");
    ctx += qa_text(q, Json(nullptr), Json(nullptr), "", "", doc_where(c, id, "doc_to_text"));

    DocRequests dr;
    dr.doc_id = id;
    dr.doc = doc;
    dr.target = doc_to(c, templates, doc, c.doc_to_target, "doc_to_target", id);
    if (!c.doc_to_choice.is_null())
      dr.choices = choices_of(doc_to(c, templates, doc, c.doc_to_choice, "doc_to_choice", id),
                              doc_where(c, id, "doc_to_choice"));
    const Json& target = dr.target;
    const std::string where = doc_where(c, id, "doc_to_target");
    if (c.output_type == "multiple_choice") {
      for (const std::string& ch : dr.choices) {
        Request r;
        r.context = ctx;
        r.continuation = c.target_delimiter + ch;
        dr.requests.push_back(std::move(r));
      }
    } else if (c.output_type == "loglikelihood" || c.output_type == "loglikelihood_rolling") {
      if (!target.is_string())
        throw ConfigError(where + ": must give a string for " + c.output_type);
      Request r;
      if (c.output_type == "loglikelihood") {
        r.context = ctx;
        r.continuation = target.get<std::string>();
      } else {
        r.type = Request::Type::loglikelihood_rolling;
        r.continuation = target.get<std::string>();
      }
      dr.requests.push_back(std::move(r));
    } else {
      Request r;
      r.type = Request::Type::generate_until;
      r.context = ctx;
      r.until = c.until;
      r.max_gen_toks = c.max_gen_toks;
      r.gen_kwargs = c.generation_kwargs;
      dr.requests.push_back(std::move(r));
    }
    docs_->push_back(std::move(dr));
  }
  if (docs_->empty()) throw ConfigError("task " + c.name + ": no documents to evaluate");
  return *docs_;
}

void Task::score(Json& results, std::vector<Json>* samples) {
  TaskConfig& c = *config_;
  // (metric, filter) -> per-document values; weighted metrics keep (loglikelihood, weight).
  std::vector<std::pair<std::string, std::string>> order;
  std::map<std::pair<std::string, std::string>, std::vector<double>> values, weights;
  auto record = [&](const std::string& m, const std::string& f, double v, double w) {
    const auto key = std::make_pair(m, f);
    if (!values.count(key)) order.push_back(key);
    values[key].push_back(v);
    weights[key].push_back(w);
  };
  std::set<std::string> wanted;
  for (const auto& m : c.metrics) wanted.insert(m.name);
  // Each regex of the filters and of exact_match's regexes_to_ignore, compiled once.
  std::map<std::string, std::unique_ptr<Regex>> regexes;
  auto regex = [&](const std::string& pattern, const std::string& what) -> const Regex& {
    auto& re = regexes[pattern];
    if (!re) re = std::make_unique<Regex>(pattern, what);
    return *re;
  };

  // lm-eval's sample log: one object per filter and document, filter-major.
  std::vector<std::vector<Json>> by_filter(c.filters.size());
  for (auto& dr : *docs_) {
    Json sample = Json::object();
    const int64_t id = dr.doc_id;
    const Json& target = dr.target;
    // As lm-eval's EvaluationTracker writes them: the target and every answer through Python's
    // str(), the arguments as {"gen_args_<i>": {"arg_0": ..., "arg_1": ...}}.
    sample["doc_id"] = id;
    sample["doc"] = dr.doc;
    sample["target"] = python_str(target);
    Json args = Json::object(), resps = Json::array();
    for (size_t k = 0; k < dr.requests.size(); ++k) {
      const Request& r = dr.requests[k];
      Json a = Json::object();
      if (r.type == Request::Type::loglikelihood) {
        a = {{"arg_0", r.context}, {"arg_1", r.continuation}};
        resps.push_back(
            Json::array({Json::array({python_str(r.loglikelihood), python_str(r.is_greedy)})}));
      } else if (r.type == Request::Type::loglikelihood_rolling) {
        a = {{"arg_0", r.continuation}};
        resps.push_back(Json::array({python_str(r.loglikelihood)}));
      } else {
        a = {{"arg_0", r.context}, {"arg_1", r.gen_kwargs}};
        resps.push_back(Json::array({r.text}));
      }
      args["gen_args_" + std::to_string(k)] = a;
    }
    sample["arguments"] = args;
    sample["resps"] = resps;
    const std::string first_arg = args["gen_args_0"]["arg_0"].get<std::string>();
    for (size_t fi = 0; fi < c.filters.size(); ++fi) {
      const FilterConfig& f = c.filters[fi];
      Json per_request = Json::array();
      Json m = Json::object();
      if (c.output_type != "generate_until") {
        for (const auto& step : f.steps)
          if (step["function"] != "take_first")
            throw ConfigError("task " + c.name + ": filter " + f.name + ": only take_first " +
                              "applies to " + c.output_type + " answers");
      }
      if (c.output_type == "multiple_choice") {
        const std::vector<std::string>& choices = dr.choices;
        std::vector<double> lls;
        std::vector<bool> greedy;
        for (const Request& r : dr.requests) {
          lls.push_back(r.loglikelihood);
          greedy.push_back(r.is_greedy);
          per_request.push_back(
              Json::array({python_str(r.loglikelihood), python_str(r.is_greedy)}));
        }
        auto argmax = [&](auto key) {
          size_t best = 0;
          for (size_t k = 1; k < lls.size(); ++k)
            if (key(k) > key(best)) best = k;
          return static_cast<int64_t>(best);
        };
        const int64_t pred = argmax([&](size_t k) { return lls[k]; });
        const int64_t pred_norm = argmax(
            [&](size_t k) { return lls[k] / static_cast<double>(code_points(choices[k]).size()); });
        const int64_t pred_bytes =
            argmax([&](size_t k) { return lls[k] / static_cast<double>(choices[k].size()); });
        int64_t gold = -100;
        if (target.is_number_integer()) {
          gold = target.get<int64_t>();
          if (gold >= static_cast<int64_t>(choices.size())) gold = -100;
        } else if (target.is_string()) {
          const auto it = std::find(choices.begin(), choices.end(), target.get<std::string>());
          if (it != choices.end()) gold = it - choices.begin();
        } else {
          throw ConfigError(doc_where(c, id, "doc_to_target") +
                            ": gives neither an index nor a choice (several targets are not "
                            "supported yet): " +
                            target.dump());
        }
        const std::vector<std::pair<std::string, double>> all = {
            {"acc", pred == gold ? 1.0 : 0.0},
            {"acc_norm", pred_norm == gold ? 1.0 : 0.0},
            {"acc_bytes", pred_bytes == gold ? 1.0 : 0.0},
            {"exact_match", gold != -100 && greedy[gold] ? 1.0 : 0.0}};
        for (const auto& [name, v] : all)
          if (wanted.count(name)) {
            m[name] = v;
            record(name, f.name, v, 1);
          }
      } else if (c.output_type == "loglikelihood") {
        const Request& r = dr.requests[0];
        per_request.push_back(Json::array({python_str(r.loglikelihood), python_str(r.is_greedy)}));
        if (wanted.count("perplexity")) {
          m["perplexity"] = r.loglikelihood;
          record("perplexity", f.name, r.loglikelihood, 1);
        }
        if (wanted.count("acc")) {
          m["acc"] = r.is_greedy ? 1 : 0;
          record("acc", f.name, r.is_greedy ? 1 : 0, 1);
        }
      } else if (c.output_type == "loglikelihood_rolling") {
        const Request& r = dr.requests[0];
        per_request.push_back(python_str(r.loglikelihood));
        const double words = static_cast<double>(count_words(r.continuation));
        const double bytes = static_cast<double>(r.continuation.size());
        for (const char* name : {"word_perplexity", "byte_perplexity", "bits_per_byte"})
          if (wanted.count(name)) {
            const double w = std::string(name) == "word_perplexity" ? words : bytes;
            m[name] = Json::array({r.loglikelihood, static_cast<int64_t>(w)});
            record(name, f.name, r.loglikelihood, w);
          }
      } else {
        // generate_until: the filter pipeline on the one response, then exact_match.
        Json resp = Json::array({dr.requests[0].text});
        for (const Json& step : f.steps) {
          const std::string fn = step["function"].get<std::string>();
          if (fn == "take_first") {
            resp = resp.is_array() ? resp[0] : resp;
            continue;
          }
          auto each = [&](auto op) {
            if (resp.is_array())
              for (auto& x : resp) x = op(x.get<std::string>());
            else
              resp = op(resp.get<std::string>());
          };
          if (fn == "regex") {
            const std::string pattern =
                step.value("regex_pattern", std::string("#### (\\-?[0-9\\.\\,]+)"));
            const int64_t group = step.value("group_select", int64_t{0});
            const std::string fallback = step.value("fallback", std::string("[invalid]"));
            const Regex& re = regex(pattern, "task " + c.name + ": filter " + f.name);
            each([&](const std::string& s) {
              const auto found = re.findall(s);
              if (found.empty()) return fallback;
              const int64_t k = group < 0 ? static_cast<int64_t>(found.size()) + group : group;
              if (k < 0 || k >= static_cast<int64_t>(found.size()))
                throw ConfigError("task " + c.name + ": filter " + f.name + ": group_select " +
                                  std::to_string(group) + " is past the " +
                                  std::to_string(found.size()) + " matches");
              std::string pick;
              if (found[k].size() == 1)
                pick = found[k][0];
              else {
                pick = fallback;
                for (const auto& g : found[k])
                  if (!g.empty()) {
                    pick = g;
                    break;
                  }
              }
              return py_strip(pick);
            });
          } else if (fn == "remove_whitespace") {
            each([](const std::string& s) { return !s.empty() && s[0] == ' ' ? s.substr(1) : s; });
          } else if (fn == "lowercase" || fn == "uppercase") {
            each([&](const std::string& s) { return py_case(s, fn == "lowercase"); });
          }
        }
        if (resp.is_array())
          throw ConfigError("task " + c.name + ": filter " + f.name +
                            " must end with take_first (one answer per document)");
        per_request.push_back(resp);
        std::string gold;
        if (!c.doc_to_choice.is_null()) {
          const std::vector<std::string>& choices = dr.choices;
          if (!target.is_number_integer() || target.get<int64_t>() < 0 ||
              target.get<int64_t>() >= static_cast<int64_t>(choices.size()))
            throw ConfigError(doc_where(c, id, "doc_to_target") + ": not an index of the choices");
          gold = choices[target.get<int64_t>()];
        } else if (target.is_string()) {
          gold = target.get<std::string>();
        } else if (target.is_number_integer()) {
          gold = std::to_string(target.get<int64_t>());
        } else {
          throw ConfigError(doc_where(c, id, "doc_to_target") +
                            ": several targets are not supported yet: " + target.dump());
        }
        for (const MetricConfig& mc : c.metrics) {
          std::string pred = resp.get<std::string>(), ref = gold;
          if (mc.kwargs.contains("regexes_to_ignore"))
            for (const auto& p : mc.kwargs["regexes_to_ignore"]) {
              const Regex& re =
                  regex(p.get<std::string>(), "task " + c.name + ": regexes_to_ignore");
              pred = re.remove(pred);
              ref = re.remove(ref);
            }
          if (mc.kwargs.value("ignore_case", false)) {
            pred = py_case(pred, true);
            ref = py_case(ref, true);
          }
          auto drop = [](std::string s, const std::string& chars) {
            s.erase(std::remove_if(s.begin(), s.end(),
                                   [&](char ch) { return chars.find(ch) != std::string::npos; }),
                    s.end());
            return s;
          };
          if (mc.kwargs.value("ignore_punctuation", false)) {
            static const std::string punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
            pred = drop(pred, punct);
            ref = drop(ref, punct);
          }
          if (mc.kwargs.value("ignore_numbers", false)) {
            pred = drop(pred, "0123456789");
            ref = drop(ref, "0123456789");
          }
          const double v = pred == ref ? 1.0 : 0.0;
          m[mc.name] = v;
          record(mc.name, f.name, v, 1);
        }
      }
      if (samples) {
        Json one = sample;
        one["filtered_resps"] = per_request;
        one["filter"] = f.name;
        Json names = Json::array();
        for (auto it = m.begin(); it != m.end(); ++it) names.push_back(it.key());
        one["metrics"] = names;
        one["doc_hash"] = sha256_hex(python_json_dumps(dr.doc));
        one["prompt_hash"] = sha256_hex(first_arg);
        one["target_hash"] = sha256_hex(python_str(target));
        for (auto it = m.begin(); it != m.end(); ++it) one[it.key()] = it.value();
        by_filter[fi].push_back(std::move(one));
      }
    }
  }
  if (samples)
    for (auto& v : by_filter)
      for (auto& one : v) samples->push_back(std::move(one));

  // Aggregates, in the order the per-document metrics came (filter, then metric).
  Json r = Json::object();
  r["name"] = c.name;
  r["alias"] = c.raw.value("task_alias", c.name);
  r["sample_len"] = docs_->size();
  Json hib = Json::object();
  for (const auto& key : order) {
    const auto& [metric, filter] = key;
    const MetricConfig& mc = *std::find_if(c.metrics.begin(), c.metrics.end(),
                                           [&](const MetricConfig& x) { return x.name == metric; });
    const std::vector<double>& v = values[key];
    const std::vector<double>& w = weights[key];
    Json value, err = "N/A";
    if (mc.aggregation == "mean") {
      const double mu = mean_of(v);
      value = mu;
      if (v.size() > 1) {
        double ss = 0;
        for (double x : v) ss += (x - mu) * (x - mu);
        err = std::sqrt(ss / static_cast<double>(v.size() - 1)) /
              std::sqrt(static_cast<double>(v.size()));
      }
    } else if (mc.aggregation == "perplexity") {
      value = std::exp(-mean_of(v));
    } else {
      double sl = 0, sw = 0;
      for (size_t k = 0; k < v.size(); ++k) {
        sl += v[k];
        sw += w[k];
      }
      value =
          mc.aggregation == "weighted_perplexity" ? std::exp(-sl / sw) : -sl / sw / std::log(2.0);
    }
    r[metric + "," + filter] = value;
    r[metric + "_stderr," + filter] = err;
    hib[metric] = mc.higher_is_better;
  }
  results["results"][c.name] = r;
  results["group_subtasks"][c.name] = Json::array();
  results["versions"][c.name] = c.version;
  results["n-shot"][c.name] = c.num_fewshot.value_or(0);
  results["higher_is_better"][c.name] = hib;
  const std::vector<Json>& eval_docs =
      c.splits.at(c.test_split.empty() ? c.validation_split : c.test_split);
  results["n-samples"][c.name] = Json{{"original", eval_docs.size()}, {"effective", docs_->size()}};
  Json cfg = c.raw;
  cfg["num_fewshot"] = c.num_fewshot.value_or(0);
  results["configs"][c.name] = cfg;
}

std::vector<fs::path> task_files(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  if (!fs::is_directory(path, ec))
    throw ConfigError("tasks path " + path.string() + ": no such file or directory" +
                      (path.is_relative() ? " (relative to the working directory " +
                                                fs::current_path(ec).string() + ")"
                                          : std::string()));
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(path)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".yaml" || ext == ".yml")) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw ConfigError("tasks path " + path.string() + ": no *.yaml task files there");
  return files;
}

void write_results(const fs::path& file, const Json& results, const fs::path& samples_dir,
                   const Json& samples) {
  auto write = [](const fs::path& p, const std::function<void(std::ostream&)>& body) {
    if (p.has_parent_path()) fs::create_directories(p.parent_path());
    const fs::path tmp = p.string() + ".tmp";
    {
      std::ofstream f(tmp);
      if (f) body(f);
      if (!f) throw ConfigError(p.string() + ": cannot be written");
    }
    fs::rename(tmp, p);
  };
  if (!file.empty())
    write(file, [&](std::ostream& f) {
      f << results.dump(2, ' ', false, Json::error_handler_t::replace) << "\n";
    });
  if (samples_dir.empty()) return;
  fs::create_directories(samples_dir);
  for (auto it = samples.begin(); it != samples.end(); ++it)
    write(samples_dir / ("samples_" + it.key() + ".jsonl"), [&](std::ostream& f) {
      for (const Json& row : it.value())
        f << row.dump(-1, ' ', false, Json::error_handler_t::replace) << "\n";
    });
}

Json evaluate(std::vector<Task>& tasks, LanguageModel& lm, Json* samples) {
  std::set<std::string> names;
  for (const Task& t : tasks)
    if (!names.insert(t.name()).second) throw ConfigError("task " + t.name() + " is given twice");
  std::vector<Request*> ll, rolling, gen;
  for (Task& t : tasks)
    for (DocRequests& d : t.build())
      for (Request& r : d.requests)
        (r.type == Request::Type::loglikelihood           ? ll
         : r.type == Request::Type::loglikelihood_rolling ? rolling
                                                          : gen)
            .push_back(&r);
  if (!ll.empty()) lm.loglikelihood(ll);
  if (!rolling.empty()) lm.loglikelihood_rolling(rolling);
  if (!gen.empty()) lm.generate_until(gen);
  Json results = {{"results", Json::object()},  {"group_subtasks", Json::object()},
                  {"configs", Json::object()},  {"versions", Json::object()},
                  {"n-shot", Json::object()},   {"higher_is_better", Json::object()},
                  {"n-samples", Json::object()}};
  for (Task& t : tasks) {
    std::vector<Json> s;
    t.score(results, samples ? &s : nullptr);
    if (samples) (*samples)[t.name()] = s;
  }
  return results;
}

}  // namespace trainrun::eval
