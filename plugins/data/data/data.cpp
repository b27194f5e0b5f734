// Dataset components of the "data" plugin: idx (MNIST-style image files) and text (a byte or
// uint16-token stream for language modelling).
//
// This file holds the components and their table (kComponents); plugin.cpp only defines the
// entry symbol from that table, so the unit tests can compile this file into an executable.
#include <glob.h>
#include <sys/stat.h>
#include <zlib.h>

#include <torch/types.h>
#include <torch/utils.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "trainrun/interfaces.hpp"
#include "trainrun/plugin.hpp"

namespace trainrun::data {

using v1::Batch;
using v1::DataInfo;
using v1::Split;

namespace {

const char* split_name(Split s) { return s == Split::Train ? "train" : "eval"; }

std::vector<uint8_t> read_raw(const std::string& path, const char* who) {
  std::ifstream in(path, std::ios::binary);
  TR_CHECK(in, who, ": cannot open '", path, "': ", std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TR_CHECK(!in.bad(), who, ": error reading '", path, "'");
  return bytes;
}

// Whole file, gunzipped when it starts with the gzip magic 1f 8b (IDX files never do: their
// magic starts with two zero bytes).
std::vector<uint8_t> read_maybe_gzip(const std::string& path, const char* who) {
  std::vector<uint8_t> raw = read_raw(path, who);
  if (raw.size() < 2 || raw[0] != 0x1f || raw[1] != 0x8b) return raw;

  z_stream zs{};
  // 16 + MAX_WBITS: expect a gzip header and trailer rather than a zlib one.
  TR_CHECK(inflateInit2(&zs, 16 + MAX_WBITS) == Z_OK, who, ": zlib initialisation failed");
  std::vector<uint8_t> out;
  out.reserve(raw.size() * 4);
  zs.next_in = raw.data();
  zs.avail_in = static_cast<uInt>(raw.size());
  int rc = Z_OK;
  uint8_t chunk[1 << 16];
  do {
    zs.next_out = chunk;
    zs.avail_out = sizeof(chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) break;
    out.insert(out.end(), chunk, chunk + (sizeof(chunk) - zs.avail_out));
    // Concatenated gzip members (as `cat a.gz b.gz` makes) form one stream.
    if (rc == Z_STREAM_END && zs.avail_in > 0) rc = inflateReset(&zs);
  } while (rc == Z_OK && (zs.avail_in > 0 || zs.avail_out == 0));
  const std::string msg = zs.msg ? zs.msg : "";
  inflateEnd(&zs);
  TR_CHECK(rc == Z_STREAM_END, who, ": '", path, "' is a corrupt or truncated gzip file",
           msg.empty() ? "" : " (", msg, msg.empty() ? "" : ")");
  return out;
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

uint32_t big_endian_u32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// IDX format (LeCun's MNIST page): magic 00 00 <type> <ndims>, then ndims big-endian uint32
// sizes, then the data in row-major order. Only unsigned bytes (type 0x08) occur in MNIST.
// Returns a uint8 tensor shaped by the file's dimensions.
torch::Tensor load_idx(const std::string& path, int expected_dims) {
  std::vector<uint8_t> b = read_maybe_gzip(path, "idx");
  TR_CHECK(b.size() >= 4 && b[0] == 0 && b[1] == 0, "idx: '", path,
           "' is not an IDX file (bad magic number",
           b.size() >= 4 ? " " + hex(big_endian_u32(b.data())) : "", ")");
  TR_CHECK(b[2] == 0x08, "idx: '", path, "' holds IDX data type ", hex(b[2]),
           "; only unsigned bytes (0x08) are supported");
  const int ndims = b[3];
  TR_CHECK(ndims == expected_dims, "idx: '", path, "' has ", ndims, " dimensions, expected ",
           expected_dims, expected_dims == 3 ? " (images N x rows x cols)" : " (labels N)");
  const size_t header = 4 + 4 * size_t(ndims);
  TR_CHECK(b.size() >= header, "idx: '", path, "' is truncated inside its header");
  std::vector<int64_t> dims;
  int64_t count = 1;
  for (int d = 0; d < ndims; ++d) {
    dims.push_back(big_endian_u32(&b[4 + 4 * size_t(d)]));
    count *= dims.back();
  }
  TR_CHECK(int64_t(b.size() - header) == count, "idx: '", path, "' has ", b.size() - header,
           " data bytes, but its dimensions ", c10::IntArrayRef(dims), " need ", count);
  torch::Tensor t = torch::empty(dims, torch::kUInt8);
  if (count > 0) std::memcpy(t.data_ptr<uint8_t>(), b.data() + header, size_t(count));
  return t;
}

void check_indices(const std::vector<int64_t>& indices, int64_t size, Split split,
                   const char* who) {
  for (int64_t i : indices)
    TR_CHECK(i >= 0 && i < size, who, ": sample index ", i, " is out of range for the ",
             split_name(split), " split of ", size, " samples");
}

torch::Tensor index_tensor(const std::vector<int64_t>& indices) {
  return torch::tensor(c10::ArrayRef<int64_t>(indices), torch::kLong);
}

}  // namespace

// =============================================================================================
// idx

class Idx final : public v1::Dataset {
 public:
  static void declare_options(v1::OptionSchema& s) {
    s.string("dir", "/usr/share/datasets/fashion-mnist", "folder holding the four IDX files");
    s.string("train_images", "train-images-idx3-ubyte.gz", "training images (relative to dir)");
    s.string("train_labels", "train-labels-idx1-ubyte.gz", "training labels (relative to dir)");
    s.string("test_images", "t10k-images-idx3-ubyte.gz", "evaluation images (relative to dir)");
    s.string("test_labels", "t10k-labels-idx1-ubyte.gz", "evaluation labels (relative to dir)");
    s.boolean("normalize", true, "scale pixels to (x/255 - mean)/std instead of x/255");
    s.real("mean", 0.2860, "pixel mean after /255 (Fashion-MNIST 0.2860, MNIST 0.1307)");
    s.real("std", 0.3530, "pixel standard deviation after /255 (Fashion-MNIST 0.3530, MNIST 0.3081)",
           1e-6);
  }

  Idx(const v1::Options& o, const v1::RunContext&) {
    normalize_ = o.get_bool("normalize");
    mean_ = o.get_double("mean");
    std_ = o.get_double("std");
    const std::string dir = o.get_string("dir");
    auto path = [&](const char* key) {
      const std::string& f = o.get_string(key);
      return (f.empty() || f[0] == '/' || dir.empty()) ? f : dir + "/" + f;
    };
    load(path("train_images"), path("train_labels"), train_images_, train_labels_);
    load(path("test_images"), path("test_labels"), test_images_, test_labels_);
    TR_CHECK(train_images_.sizes().slice(1) == test_images_.sizes().slice(1), "idx: training images ",
             "are ", train_images_.sizes().slice(1), " but evaluation images are ",
             test_images_.sizes().slice(1), " ('", path("train_images"), "', '",
             path("test_images"), "')");
    int64_t max_label = -1;
    for (const auto& l : {train_labels_, test_labels_})
      if (l.numel() > 0) max_label = std::max(max_label, l.max().item<int64_t>());
    info_.task = "classification";
    info_.sample_shape = train_images_.sizes().slice(1).vec();
    info_.num_classes = max_label >= 0 ? max_label + 1 : 10;
  }

  DataInfo info() const override { return info_; }
  int64_t size(Split split) const override {
    return (split == Split::Train ? train_labels_ : test_labels_).size(0);
  }

  Batch batch(Split split, const std::vector<int64_t>& indices) override {
    const bool train = split == Split::Train;
    check_indices(indices, size(split), split, "idx");
    torch::Tensor idx = index_tensor(indices);
    torch::Tensor x = (train ? train_images_ : test_images_).index_select(0, idx).to(torch::kFloat);
    x.div_(255.0);
    if (normalize_) x.sub_(mean_).div_(std_);
    Batch b;
    b.input = x;
    b.target = (train ? train_labels_ : test_labels_).index_select(0, idx);
    b.num_samples = b.num_targets = int64_t(indices.size());
    return b;
  }

 private:
  // images: uint8 [N, 1, rows, cols]; labels: int64 [N].
  static void load(const std::string& images_path, const std::string& labels_path,
                   torch::Tensor& images, torch::Tensor& labels) {
    images = load_idx(images_path, 3).unsqueeze(1);
    labels = load_idx(labels_path, 1).to(torch::kLong);
    TR_CHECK(labels.size(0) == images.size(0), "idx: '", labels_path, "' has ", labels.size(0),
             " labels but '", images_path, "' has ", images.size(0), " images");
  }

  bool normalize_;
  double mean_, std_;
  torch::Tensor train_images_, train_labels_, test_images_, test_labels_;
  DataInfo info_;
};

// =============================================================================================
// text
//
// The files (in the order given, each pattern's matches sorted by name) form one token stream.
// The last eval_fraction of it is held out. Training sample i is the window starting at token i
// (every offset, so an epoch sees each position at every place in the context); evaluation
// sample i is the window starting at i*block_size inside the held-out part (non-overlapping, so
// each held-out token is predicted once). A window has block_size+1 tokens: the input is the
// first block_size, the target the last block_size (the next token at each position).

class Text final : public v1::Dataset {
 public:
  static void declare_options(v1::OptionSchema& s) {
    s.add({"paths", v1::OptionType::StringList, std::monostate{}, /*required=*/true, {}, {}, {},
           "files or glob(3) patterns (with {a,b} and ~), read in this order; each pattern "
           "must match at least one file"});
    s.choice("format", "bytes", {"bytes", "uint16", "uint32", "auto"},
             "bytes: every byte is a token (vocabulary 256); uint16 / uint32: pre-tokenized "
             "little-endian 16- or 32-bit token ids (raw, no header; uint32 for vocabularies "
             "above 65536); auto: each file's sidecar FILE.json (written by `trainrun tokenize`) "
             "names the dtype and vocabulary");
    s.integer("block_size", 128, "tokens per sample T; must equal the model's block_size", 1,
              1 << 20);
    s.real("eval_fraction", 0.1, "fraction of the stream, taken from its end, held out for "
                                 "evaluation", 0.0, 0.99);
    s.integer("vocab_size", 0, "vocabulary size; 0 = 256 for bytes, largest token id + 1 for "
                               "token files (give the tokenizer's to be safe)", 0, 1 << 24);
  }

  Text(const v1::Options& o, const v1::RunContext&) {
    block_ = o.get_int("block_size");
    const std::vector<std::string> files = expand(o.get_string_list("paths"), o.context());
    std::string format = o.get_string("format");
    int64_t sidecar_vocab = 0;
    if (format == "auto") std::tie(format, sidecar_vocab) = sidecar_format(files, o.context());
    const bool bytes = format == "bytes";
    const size_t width = bytes ? 1 : format == "uint16" ? 2 : 4;

    // Tokens are kept in the narrowest type that holds them; batches widen to int64.
    std::vector<uint8_t> stream;
    for (const auto& f : files) {
      std::vector<uint8_t> b = read_raw(f, "text");
      TR_CHECK(b.size() % width == 0, "text: '", f, "' has ", b.size(), " bytes, not a multiple of ",
               width, ", so it is not a ", format, " token file");
      stream.insert(stream.end(), b.begin(), b.end());
    }
    int64_t max_token = -1;
    if (bytes) {
      tokens_ = torch::empty({int64_t(stream.size())}, torch::kUInt8);
      if (!stream.empty()) std::memcpy(tokens_.data_ptr<uint8_t>(), stream.data(), stream.size());
    } else if (width == 2) {
      const int64_t n = int64_t(stream.size() / 2);
      tokens_ = torch::empty({n}, torch::kInt32);
      int32_t* t = tokens_.data_ptr<int32_t>();
      for (int64_t i = 0; i < n; ++i) t[i] = stream[2 * i] | (int32_t(stream[2 * i + 1]) << 8);
    } else {
      const int64_t n = int64_t(stream.size() / 4);
      tokens_ = torch::empty({n}, torch::kInt32);
      int32_t* t = tokens_.data_ptr<int32_t>();
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t v = uint32_t(stream[4 * i]) | (uint32_t(stream[4 * i + 1]) << 8) |
                           (uint32_t(stream[4 * i + 2]) << 16) | (uint32_t(stream[4 * i + 3]) << 24);
        TR_CHECK(v < (1u << 31), o.context(), ": token ", i, " of the uint32 stream is ", v,
                 ", not a token id");
        t[i] = int32_t(v);
      }
    }
    if (tokens_.numel() > 0) max_token = tokens_.max().item<int64_t>();

    int64_t vocab = o.get_int("vocab_size");
    if (vocab == 0) vocab = bytes ? 256 : sidecar_vocab > 0 ? sidecar_vocab : max_token + 1;
    TR_CHECK(max_token < vocab, o.context(), ": token id ", max_token,
             " occurs in the data but vocab_size is ", vocab);

    const int64_t n = tokens_.numel();
    const double frac = o.get_double("eval_fraction");
    const int64_t eval_len = static_cast<int64_t>(static_cast<double>(n) * frac);
    train_len_ = n - eval_len;
    TR_CHECK(train_len_ > block_, o.context(), ": the training part has ", train_len_, " tokens (", n, " in ",
             files.size(), " files, eval_fraction ", frac, "), need more than block_size = ", block_);
    train_size_ = train_len_ - block_;
    eval_size_ = eval_len > 0 ? (eval_len - 1) / block_ : 0;
    TR_CHECK(frac == 0 || eval_size_ > 0, o.context(), ": the held-out part has ", eval_len,
             " tokens, need more than block_size = ", block_,
             "; raise eval_fraction or set it to 0");

    info_.task = "language_modeling";
    info_.sample_shape = {block_};
    info_.vocab_size = vocab;
  }

  DataInfo info() const override { return info_; }
  int64_t size(Split split) const override {
    return split == Split::Train ? train_size_ : eval_size_;
  }

  Batch batch(Split split, const std::vector<int64_t>& indices) override {
    check_indices(indices, size(split), split, "text");
    torch::Tensor start = index_tensor(indices);
    if (split == Split::Eval) start = start * block_ + train_len_;
    // [B, T+1] token positions: each window's start plus 0..T.
    torch::Tensor pos = start.unsqueeze(1) + torch::arange(block_ + 1, torch::kLong).unsqueeze(0);
    torch::Tensor w = tokens_.index_select(0, pos.reshape({-1})).reshape(pos.sizes()).to(torch::kLong);
    Batch b;
    b.input = w.narrow(1, 0, block_).contiguous();
    b.target = w.narrow(1, 1, block_).contiguous();
    b.num_samples = int64_t(indices.size());
    b.num_targets = b.num_tokens = b.num_samples * block_;
    return b;
  }

 private:
  // format = "auto": the dtype ("uint16" / "uint32") and vocab_size that every file's sidecar
  // FILE.json (trainrun tokenize) states; they must agree across files.
  static std::pair<std::string, int64_t> sidecar_format(const std::vector<std::string>& files,
                                                        const std::string& context) {
    std::string dtype;
    int64_t vocab = 0;
    for (const auto& f : files) {
      const std::string side = f + ".json";
      std::ifstream in(side);
      TR_CHECK(in.good(), context, ": format = \"auto\" needs the sidecar '", side,
               "' (written by `trainrun tokenize`); give format = \"uint16\" or \"uint32\" for raw token files");
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(in);
      } catch (const nlohmann::json::exception& e) {
        TR_FAIL(side, ": not valid JSON: ", e.what());
      }
      TR_CHECK(j.is_object() && j.contains("dtype") && j["dtype"].is_string(), side, ": no string \"dtype\"");
      const std::string d = j["dtype"].get<std::string>();
      TR_CHECK(d == "uint16" || d == "uint32", side, ": dtype \"", d, "\" is not supported (uint16, uint32)");
      TR_CHECK(dtype.empty() || d == dtype, side, ": dtype ", d, " differs from ", dtype,
               " of the files before it in paths");
      dtype = d;
      if (j.contains("vocab_size") && j["vocab_size"].is_number_integer()) {
        const int64_t v = j["vocab_size"].get<int64_t>();
        TR_CHECK(vocab == 0 || v == vocab, side, ": vocab_size ", v, " differs from ", vocab,
                 " of the files before it in paths");
        vocab = v;
      }
    }
    return {dtype, vocab};
  }

  static std::vector<std::string> expand(const std::vector<std::string>& patterns,
                                         const std::string& context) {
    TR_CHECK(!patterns.empty(), context, ": paths is required: list the text files or glob patterns");
    std::vector<std::string> files;
    for (const auto& p : patterns) {
      glob_t g{};
      const int rc = glob(p.c_str(), GLOB_BRACE | GLOB_TILDE | GLOB_ERR, nullptr, &g);
      if (rc != 0) {
        globfree(&g);
        TR_CHECK(rc != GLOB_NOMATCH, context, ": '", p, "' in paths matches no file");
        TR_FAIL(context, ": cannot expand '", p, "' in paths (",
                rc == GLOB_ABORTED ? "a folder could not be read" : "out of memory", ")");
      }
      for (size_t i = 0; i < g.gl_pathc; ++i) {
        struct stat st {};
        const std::string f = g.gl_pathv[i];
        if (stat(f.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
          globfree(&g);
          TR_FAIL(context, ": '", f, "' (from '", p, "' in paths) is a folder, not a file");
        }
        files.push_back(f);
      }
      globfree(&g);
    }
    return files;
  }

  int64_t block_ = 0;
  int64_t train_len_ = 0, train_size_ = 0, eval_size_ = 0;
  torch::Tensor tokens_;  // uint8 (bytes) or int32 (uint16) [n]
  DataInfo info_;
};

/// The components of the "data" plugin, in the order `trainrun plugins` lists them.
extern const trainrun_component_v1 kComponents[] = {
    v1::component<v1::Dataset, Idx>("idx", "MNIST / Fashion-MNIST IDX image files (raw or gzipped)"),
    v1::component<v1::Dataset, Text>("text", "Language modelling on byte or uint16/uint32 token files"),
};
static_assert(sizeof(kComponents) / sizeof(kComponents[0]) == 2,
              "plugin.cpp and the tests list the components by index");

}  // namespace trainrun::data
