// `trainrun tokenize`: a pre-training corpus as one token file for the `text` dataset. Every
// document is encoded without special tokens and followed by the EOS id, so document
// boundaries survive concatenation (as GPT-2's <|endoftext|> separated WebText documents). A
// document is a whole text file, or the "text" field of one line of a .jsonl file. Documents
// are encoded in chunks, each on all threads (Tokenizer::encode_batch), and written in input
// order; ids are little-endian uint16 when the vocabulary fits, else uint32. The output appears
// under its name only when complete (written as NAME.tmp, then renamed), followed by the
// sidecar NAME.json that names the dtype, tokenizer and counts.
#include "tokenize_cli.hpp"
#include "command_line.hpp"
#include "jsonl_line.hpp"

#include <unistd.h>

#include <boost/program_options.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "trainrun/error.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;
using nlohmann::json;

namespace trainrun::app {
namespace {

using v1::ConfigError;

constexpr size_t kChunkBytes = 64u << 20;  // text encoded per encode_batch call
constexpr size_t kChunkDocs = 1u << 16;

bool is_jsonl(const std::string& f) {
  const std::string ext = fs::path(f).extension().string();
  return ext == ".jsonl" || ext == ".ndjson";
}

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (b >= 1000 && u < 4) b /= 1000, ++u;
  std::ostringstream os;
  os << std::fixed << std::setprecision(u ? 1 : 0) << b << " " << unit[u];
  return os.str();
}

// A progress line on stderr: redrawn in place on a terminal, a line every 10% otherwise.
class Progress {
 public:
  explicit Progress(uint64_t total) : total_(total), tty_(isatty(2) != 0), t0_(std::chrono::steady_clock::now()) {}
  void update(uint64_t bytes, uint64_t tokens, uint64_t docs, bool final = false) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    const double frac = total_ ? static_cast<double>(bytes) / static_cast<double>(total_) : 1.0;
    const int decile = static_cast<int>(frac * 10);
    if (!tty_ && (final ? last_decile_ >= 10 : decile <= last_decile_)) return;
    last_decile_ = decile;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::ostringstream os;
    os << (tty_ ? "\r" : "") << "tokenize [" << std::string(filled, '#') << std::string(kWidth - filled, ' ') << "] "
       << std::fixed << std::setprecision(1) << 100 * frac << "%  " << human_bytes(static_cast<double>(bytes))
       << " / " << human_bytes(static_cast<double>(total_)) << ", " << docs << " documents, " << tokens
       << " tokens, " << std::setprecision(0) << (s > 0 ? static_cast<double>(tokens) / s : 0) << " tokens/s"
       << (tty_ && !final ? "" : "\n");
    std::cerr << os.str() << std::flush;
  }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  uint64_t total_;
  bool tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point t0_;
};

struct Totals {
  uint64_t documents = 0, tokens = 0, bytes = 0;
};

class Writer {
 public:
  Writer(const std::string& path, int width) : path_(path), width_(width), f_(path, std::ios::binary | std::ios::trunc) {
    if (!f_) throw ConfigError("--output " + path + ": cannot be written");
  }
  void put(const std::vector<int32_t>& ids) {
    buf_.clear();
    buf_.reserve(ids.size() * static_cast<size_t>(width_));
    for (int32_t id : ids) {
      const auto v = static_cast<uint32_t>(id);
      for (int b = 0; b < width_; ++b) buf_.push_back(static_cast<char>((v >> (8 * b)) & 0xff));
    }
    f_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    if (!f_) throw std::runtime_error(path_ + ": write failed (disk full?)");
  }
  void close() {
    f_.close();
    if (!f_) throw std::runtime_error(path_ + ": write failed (disk full?)");
  }

 private:
  std::string path_;
  int width_;
  std::ofstream f_;
  std::string buf_;
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ConfigError(path + ": cannot be read");
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Documents gathered into chunks (kChunkBytes, kChunkDocs), each chunk encoded on all threads and
// written in input order, every document followed by the EOS id.
class ChunkEncoder {
 public:
  ChunkEncoder(const text::Tokenizer& tok, int32_t eos, int threads, Writer& out,
               Progress& progress)
      : tok_(tok), eos_(eos), threads_(threads), out_(out), progress_(progress) {}
  void add(std::string&& doc, const std::string& where) {
    chunk_bytes_ += doc.size();
    docs_.push_back(std::move(doc));
    wheres_.push_back(where);
    if (chunk_bytes_ >= kChunkBytes || docs_.size() >= kChunkDocs) flush();
  }
  void flush() {
    if (docs_.empty()) return;
    std::vector<std::vector<int32_t>> ids;
    try {
      ids = tok_.encode_batch(docs_, /*add_special_tokens=*/false, threads_);
    } catch (const std::invalid_argument&) {
      // Invalid UTF-8: name the document (the batch's message does not know it).
      for (size_t i = 0; i < docs_.size(); ++i) try {
          (void)tok_.encode(docs_[i]);
        } catch (const std::invalid_argument& e) {
          throw ConfigError(wheres_[i] + ": " + e.what());
        }
      throw;
    }
    for (auto doc : ids) {
      doc.push_back(eos_);
      out_.put(doc);
      done_.tokens += doc.size();
    }
    done_.documents += docs_.size();
    done_.bytes += chunk_bytes_;
    docs_.clear();
    wheres_.clear();
    chunk_bytes_ = 0;
    progress_.update(bytes_read, done_.tokens, done_.documents);
  }
  const Totals& done() const { return done_; }
  uint64_t bytes_read = 0;  // of the input files, for the progress bar

 private:
  const text::Tokenizer& tok_;
  int32_t eos_;
  int threads_;
  Writer& out_;
  Progress& progress_;
  Totals done_;
  std::vector<std::string> docs_, wheres_;  // texts of this chunk and where each came from
  size_t chunk_bytes_ = 0;
};

// The command line of `trainrun tokenize`.
struct TokenizeArgs {
  std::string tokenizer, output, dtype = "auto", text_key = "text", eos_token;
  std::vector<std::string> files;
  int threads = 0;
};

// OUTPUT.json: what the text dataset (format = "auto") needs to read OUTPUT. Returns its path.
std::string write_sidecar(const TokenizeArgs& a, const text::Tokenizer& tok, int32_t eos,
                          const Totals& done) {
  json side = {{"format", "trainrun-tokens"},
               {"dtype", a.dtype},
               {"byte_order", "little"},
               {"tokenizer", fs::absolute(a.tokenizer).lexically_normal().string()},
               {"vocab_size", tok.vocab_size()},
               {"eos_token_id", eos},
               {"eos_token", tok.id_to_token(eos)},
               {"documents", done.documents},
               {"tokens", done.tokens},
               {"text_bytes", done.bytes},
               {"files", a.files}};
  const std::string side_path = a.output + ".json";
  std::ofstream s(side_path + ".tmp");
  s << side.dump(2) << "\n";
  s.close();
  if (!s) throw std::runtime_error(side_path + ": write failed");
  fs::rename(side_path + ".tmp", side_path);
  return side_path;
}

// Everything after the flags; writes the token file as `tmp`, renamed to --output when complete.
int tokenize(TokenizeArgs& a, const std::string& tmp) {
  uint64_t total_bytes = 0;
  for (const auto& f : a.files) {
    std::error_code ec;
    if (!fs::is_regular_file(f, ec)) return command_error("tokenize", f + ": no such file");
    total_bytes += fs::file_size(f);
  }
  const text::Tokenizer tok = text::Tokenizer::from_directory(a.tokenizer);
  const auto eos = a.eos_token.empty() ? tok.eos_token_id() : tok.token_to_id(a.eos_token);
  if (!eos && !a.eos_token.empty())
    return command_error("tokenize",
                         "--eos-token '" + a.eos_token + "' is not a token of " + a.tokenizer);
  if (!eos)
    return command_error("tokenize", a.tokenizer +
                                         ": the tokenizer names no eos_token "
                                         "(tokenizer_config.json), which separates "
                                         "documents; give --eos-token TOKEN");
  const int64_t vocab = tok.vocab_size();
  if (a.dtype == "auto") a.dtype = vocab <= 65536 ? "uint16" : "uint32";
  if (a.dtype == "uint16" && vocab > 65536)
    return command_error("tokenize", "--dtype uint16: the vocabulary has " + std::to_string(vocab) +
                                         " ids, more than 65536");

  Writer out(tmp, a.dtype == "uint16" ? 2 : 4);
  Progress progress(total_bytes);
  ChunkEncoder encoder(tok, *eos, a.threads, out, progress);
  for (const auto& f : a.files) {
    if (!is_jsonl(f)) {
      encoder.add(read_file(f), f);
      encoder.bytes_read += fs::file_size(f);
      continue;
    }
    std::ifstream in(f, std::ios::binary);
    if (!in) return command_error("tokenize", f + ": cannot be read");
    std::string line;
    for (int64_t n = 1; std::getline(in, line); ++n) {
      encoder.bytes_read += line.size() + 1;
      json j;
      if (!parse_jsonl_line(line, f, n, j)) continue;
      if (!j.is_object() || !j.contains(a.text_key) || !j[a.text_key].is_string())
        throw ConfigError(f + ":" + std::to_string(n) + ": expected an object with a string \"" +
                          a.text_key + "\"");
      encoder.add(j[a.text_key].get<std::string>(), f + ":" + std::to_string(n));
    }
  }
  encoder.flush();
  out.close();
  const Totals& done = encoder.done();
  progress.update(total_bytes, done.tokens, done.documents, /*final=*/true);
  fs::rename(tmp, a.output);
  const std::string side_path = write_sidecar(a, tok, *eos, done);
  const double secs = progress.seconds();
  std::cerr << "tokenize: " << done.documents << " documents, " << done.tokens << " tokens ("
            << a.dtype << ") in " << std::fixed << std::setprecision(2) << secs << " s, "
            << std::setprecision(0) << (secs > 0 ? static_cast<double>(done.tokens) / secs : 0)
            << " tokens/s -> " << a.output << " + " << side_path << std::endl;
  return 0;
}

}  // namespace

int run_tokenize_command(int argc, char** argv) {
  TokenizeArgs a;
  po::options_description opts("trainrun tokenize options");
  opts.add_options()("help,h", "show this help")(
      "tokenizer", po::value(&a.tokenizer),
      "model directory with tokenizer.json (or tokenizer.model)")(
      "output,o", po::value(&a.output), "token file to write (its sidecar: OUTPUT.json)")(
      "dtype", po::value(&a.dtype),
      "auto (default: uint16 when every id fits, else uint32), uint16 or uint32")(
      "eos-token", po::value(&a.eos_token),
      "token that ends every document (default: the tokenizer's eos_token)")(
      "text-key", po::value(&a.text_key),
      "JSONL files: the field holding a document's text (default \"text\")")(
      "threads", po::value(&a.threads), "encoding threads (default 0: all cores)");
  po::variables_map vm;
  if (const auto done = parse_command_line(
          argc, argv, "tokenize",
          "usage: trainrun tokenize --tokenizer DIR --output corpus.bin [--threads N] FILES...\n"
          "  FILES: text files (one document each) and .jsonl files (one document per line, its "
          "\"text\").\n"
          "  Writes the ids of every document followed by EOS, little-endian uint16 or uint32,\n"
          "  and OUTPUT.json naming the dtype, tokenizer and counts (the text dataset's format = "
          "\"auto\").",
          opts, vm, &a.files))
    return *done;
  if (a.tokenizer.empty() || a.output.empty())
    return command_error("tokenize", "--tokenizer DIR and --output FILE are required (see --help)");
  if (a.files.empty())
    return command_error("tokenize", "give the text or .jsonl files to tokenize");
  if (a.dtype != "auto" && a.dtype != "uint16" && a.dtype != "uint32")
    return command_error("tokenize", "--dtype must be auto, uint16 or uint32");
  const std::string tmp = a.output + ".tmp";
  // A failure leaves no partial token file behind.
  auto fail = [&](const std::exception& e, int code) {
    std::error_code ec;
    fs::remove(tmp, ec);
    std::cerr << "trainrun tokenize: error: " << e.what() << std::endl;
    return code;
  };
  try {
    return tokenize(a, tmp);
  } catch (const ConfigError& e) {
    return fail(e, 2);
  } catch (const std::invalid_argument& e) {
    return fail(e, 2);
  } catch (const std::exception& e) {
    return fail(e, 1);
  }
}

}  // namespace trainrun::app
