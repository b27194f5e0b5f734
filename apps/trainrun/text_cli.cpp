// `trainrun encode` and `trainrun decode`. Plain mode reads the whole of stdin as one text (its
// bytes exactly: a trailing newline is encoded too) or one JSON array of ids; --jsonl reads one
// {"text": ...} / {"ids": [...]} object per line and writes one object per line, in order.
#include "text_cli.hpp"
#include "command_line.hpp"

#include <boost/program_options.hpp>

#include <chrono>
#include <charconv>
#include <iostream>
#include <iterator>
#include <sstream>

#include <nlohmann/json.hpp>

#include "trainrun/error.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace po = boost::program_options;

namespace trainrun::app {

namespace {

using json = nlohmann::json;

struct TextOptions {
  std::string tokenizer;
  bool jsonl = false, special = false, stats = false;
  int threads = 0;
};

// Parses the common flags; returns -1 to go on, or an exit code.
int parse(int argc, char** argv, const char* cmd, const char* special_flag, const char* special_help,
          bool with_threads, TextOptions& o) {
  po::options_description opts(std::string("trainrun ") + cmd + " options");
  opts.add_options()("help,h", "show this help")
      ("tokenizer", po::value<std::string>(&o.tokenizer), "model directory with tokenizer.json (or tokenizer.model)")
      (special_flag, po::bool_switch(&o.special), special_help)
      ("jsonl", po::bool_switch(&o.jsonl), "one JSON object per line in and out");
  if (with_threads)
    opts.add_options()("threads", po::value<int>(&o.threads)->default_value(0), "encoding threads (0: all cores)")
        ("stats", po::bool_switch(&o.stats), "print texts, bytes, tokens and throughput to stderr");
  po::variables_map vm;
  const std::string usage = std::string("usage: trainrun ") + cmd + " --tokenizer DIR [--" +
                            special_flag + "] [--jsonl]" +
                            (with_threads ? " [--threads N] [--stats]" : "") + " < input";
  if (const auto done = parse_command_line(argc, argv, cmd, usage, opts, vm)) return *done;
  if (o.tokenizer.empty()) {
    std::cerr << "trainrun " << cmd << ": error: --tokenizer DIR is required (see --help)" << std::endl;
    return 2;
  }
  return -1;
}

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// One JSON object per non-final line, with where it stands ("stdin:LINE", 1-based) for errors;
// that is in read_jsonl's own errors too.
struct JsonlRow {
  std::string where;
  json value;
};

std::vector<JsonlRow> read_jsonl(const std::string& input) {
  std::vector<JsonlRow> rows;
  size_t line = 0, pos = 0;
  while (pos < input.size()) {
    size_t end = input.find('\n', pos);
    if (end == std::string::npos) end = input.size();
    ++line;
    std::string_view text(input.data() + pos, end - pos);
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    pos = end + 1;
    const std::string where = "stdin:" + std::to_string(line);
    try {
      rows.push_back({where, json::parse(text)});
    } catch (const json::parse_error& e) {
      throw v1::ConfigError(where + ": not a JSON object: " + v1::parse_error_text(e.what()));
    }
    if (!rows.back().value.is_object()) throw v1::ConfigError(where + ": not a JSON object");
  }
  return rows;
}

void append_ids(std::string& out, const std::vector<int32_t>& ids) {
  out += '[';
  char buf[16];
  for (size_t k = 0; k < ids.size(); ++k) {
    if (k) out += ',';
    auto r = std::to_chars(buf, buf + sizeof buf, ids[k]);
    out.append(buf, r.ptr);
  }
  out += ']';
}

std::vector<int32_t> ids_of(const json& j, const std::string& where) {
  if (!j.is_array()) throw v1::ConfigError(where + ": expected a JSON array of token ids");
  std::vector<int32_t> ids;
  ids.reserve(j.size());
  for (size_t k = 0; k < j.size(); ++k) {
    if (!j[k].is_number_integer() || j[k].get<int64_t>() < INT32_MIN || j[k].get<int64_t>() > INT32_MAX)
      throw v1::ConfigError(where + ": element " + std::to_string(k) + " (" + j[k].dump() + ") is not a token id");
    ids.push_back(j[k].get<int32_t>());
  }
  return ids;
}

template <class F>
int guarded(const char* cmd, F body) {
  try {
    return body();
  } catch (const v1::ConfigError& e) {
    std::cerr << "trainrun " << cmd << ": error: " << e.what() << std::endl;
  } catch (const std::invalid_argument& e) {
    std::cerr << "trainrun " << cmd << ": error: stdin: " << e.what() << std::endl;
  } catch (const std::out_of_range& e) {
    std::cerr << "trainrun " << cmd << ": error: " << e.what() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "trainrun " << cmd << ": error: " << e.what() << std::endl;
    return 1;
  }
  return 2;
}

// `trainrun CMD`: parses the flags (parse()), then, under guarded(), loads the tokenizer, reads
// stdin and returns body(options, tokenizer, input).
template <class F>
int run_text_command(int argc, char** argv, const char* cmd, const char* special_flag,
                     const char* special_help, bool with_threads, F body) {
  TextOptions o;
  if (int rc = parse(argc, argv, cmd, special_flag, special_help, with_threads, o); rc >= 0)
    return rc;
  return guarded(cmd, [&] {
    const auto tok = text::Tokenizer::from_directory(o.tokenizer);
    const std::string input = read_stdin();
    return body(o, tok, input);
  });
}

// `trainrun encode` after its flags: the ids of stdin's text, or of each {"text"} line.
int encode(const TextOptions& o, const text::Tokenizer& tok, const std::string& input) {
  std::vector<std::string> texts;
  if (o.jsonl) {
    for (auto& [where, row] : read_jsonl(input)) {
      if (!row.contains("text") || !row["text"].is_string())
        throw v1::ConfigError(where + ": no \"text\" string");
      texts.push_back(row["text"].get<std::string>());
    }
  } else {
    texts.push_back(input);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto ids = tok.encode_batch(texts, o.special, o.threads);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string out;
  for (const auto& row : ids) {
    if (o.jsonl) out += "{\"ids\":";
    append_ids(out, row);
    out += o.jsonl ? "}\n" : "\n";
  }
  std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
  std::cout.flush();
  if (o.stats) {
    size_t bytes = 0, tokens = 0;
    for (const auto& t : texts) bytes += t.size();
    for (const auto& r : ids) tokens += r.size();
    std::cerr << "encoded " << texts.size() << " texts, " << bytes << " bytes, " << tokens
              << " tokens in " << seconds << " s: " << (bytes / 1e6 / seconds) << " MB/s"
              << std::endl;
  }
  return 0;
}

// `trainrun decode` after its flags: the text of stdin's array of ids, or of each {"ids"} line.
int decode(const TextOptions& o, const text::Tokenizer& tok, const std::string& input) {
  std::string out;
  if (o.jsonl) {
    for (auto& [where, row] : read_jsonl(input)) {
      if (!row.contains("ids")) throw v1::ConfigError(where + ": no \"ids\" array");
      std::string text;
      try {
        text = tok.decode(ids_of(row["ids"], where), o.special);
      } catch (const std::out_of_range& e) {
        throw std::out_of_range(where + ": " + e.what());
      }
      out += json{{"text", text}}.dump() + "\n";
    }
  } else {
    json j;
    try {
      j = json::parse(input);
    } catch (const json::parse_error& e) {
      throw v1::ConfigError(std::string("stdin: not a JSON array of token ids: ") +
                            v1::parse_error_text(e.what()));
    }
    out = tok.decode(ids_of(j, "stdin"), o.special);
  }
  std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
  std::cout.flush();
  return 0;
}

}  // namespace

int run_encode_command(int argc, char** argv) {
  return run_text_command(argc, argv, "encode", "add-special-tokens",
                          "add BOS/EOS as the tokenizer's post-processor says", true, encode);
}

int run_decode_command(int argc, char** argv) {
  return run_text_command(argc, argv, "decode", "skip-special-tokens",
                          "leave out special tokens (BOS, EOS, ...)", false, decode);
}

}  // namespace trainrun::app
