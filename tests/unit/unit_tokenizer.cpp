// Units of the tokenizer (text/src/tokenizer*.cpp): the pieces on hand-made tokenizer.json files,
// and a few fixed ids of the real fixture tokenizers. Equality with Hugging Face `tokenizers` on
// a large corpus is tests/e2e/tokenizer_reference.py.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "../../text/src/tokenizer_internal.hpp"

#include <filesystem>
#include <fstream>
#include <set>

#include <unistd.h>

using trainrun::text::Tokenizer;
using json = nlohmann::json;
namespace fs = std::filesystem;
namespace d = trainrun::text::detail;

namespace {

// A temporary model directory holding the given tokenizer.json (and config).
struct TempModel {
  fs::path dir;
  explicit TempModel(const json& tokenizer, const json& config = json()) {
    static int n = 0;
    dir = fs::temp_directory_path() / ("trainrun_unit_tok_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << tokenizer.dump();
    if (!config.is_null()) std::ofstream(dir / "tokenizer_config.json") << config.dump();
  }
  ~TempModel() { fs::remove_all(dir); }
};

// Character-level BPE over "abc" with two merges, byte-level off.
json tiny(json merges = json::array({"b c", "a b"})) {
  return json{{"model",
               {{"type", "BPE"},
                {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"bc", 3}, {"ab", 4}, {"aa", 5}, {" ", 6}}},
                {"merges", merges}}},
              {"added_tokens", json::array()}};
}

std::vector<int32_t> ids(std::initializer_list<int32_t> l) { return l; }

}  // namespace

TEST_CASE("byte-level alphabet is a bijection with GPT-2's printable stand-ins") {
  const auto& chars = d::byte_level_chars();
  std::set<std::string> seen(chars.begin(), chars.end());
  CHECK(seen.size() == 256);
  CHECK(chars[' '] == "\xC4\xA0");   // U+0120 'Ġ'
  CHECK(chars['\n'] == "\xC4\x8A");  // U+010A 'Ċ'
  CHECK(chars['A'] == "A");
  for (int b = 0; b < 256; ++b) {
    size_t i = 0;
    CHECK(d::byte_level_byte(d::utf8_next(chars[b], i)) == b);
  }
}

TEST_CASE("invalid UTF-8 becomes one U+FFFD per maximal ill-formed subsequence, as Rust's from_utf8_lossy") {
  const std::string r = "\xEF\xBF\xBD";
  CHECK(d::utf8_lossy("ok") == "ok");
  CHECK(d::utf8_lossy("\xFF") == r);
  CHECK(d::utf8_lossy("a\xE2\x82") == "a" + r);         // truncated 3-byte sequence: one
  CHECK(d::utf8_lossy("\xE0\x80") == r + r);            // E0 80 is never valid: two
  CHECK(d::utf8_lossy("\xF0\x9F\x98\x80") == "\xF0\x9F\x98\x80");
  CHECK(d::utf8_lossy("\xED\xA0\x80") == r + r + r);    // surrogate code point
  CHECK(d::utf8_invalid_offset("ab\xC3") == 2);
  CHECK(d::utf8_invalid_offset("ab\xC3\xA9") == std::string::npos);
}

TEST_CASE("regex: Oniguruma's \\s, \\p{L}, case-insensitive groups and negative lookahead") {
  std::vector<std::pair<size_t, size_t>> m;
  d::Regex ws("\\s+");
  ws.find_all("a\xE3\x80\x80" "b", m);  // U+3000 ideographic space is \s
  REQUIRE(m.size() == 1);
  CHECK(m[0] == std::make_pair<size_t, size_t>(1, 4));
  m.clear();
  ws.find_all("a\xE1\xA0\x8E" "b", m);  // U+180E is not White_Space (PCRE2's own \s says it is)
  CHECK(m.empty());
  m.clear();
  d::Regex re("(?i:'s|'ll)|\\p{L}+|\\s+(?!\\S)|\\s+");
  re.find_all("IT'S  ok'LL", m);
  std::vector<std::pair<size_t, size_t>> want{{0, 2}, {2, 4}, {4, 5}, {5, 6}, {6, 8}, {8, 11}};
  CHECK(m == want);
}

TEST_CASE("BPE merges the lowest-ranked pair first, leftmost among equals; both merge forms load") {
  for (json merges : {json::array({"b c", "a b", "a a"}), json::array({json::array({"b", "c"}), json::array({"a", "b"}), json::array({"a", "a"})})}) {
    TempModel m(tiny(merges));
    const auto tok = Tokenizer::from_directory(m.dir.string());
    CHECK(tok.encode("abc") == ids({0, 3}));     // "b c" (rank 0) before "a b"
    CHECK(tok.encode("ab") == ids({4}));
    CHECK(tok.encode("aaa") == ids({5, 0}));     // leftmost pair merges first
    CHECK(tok.encode("xa") == ids({0}));         // no unk token: an unknown character is dropped
    CHECK(tok.decode({0, 3}) == "a bc");         // no decoder: tokens joined by spaces
  }
}

TEST_CASE("byte_fallback spells unknown characters as <0xNN> tokens, and ByteFallback decodes them") {
  json t = tiny();
  t["model"]["byte_fallback"] = true;
  t["model"]["vocab"]["<0xC3>"] = 7;
  t["model"]["vocab"]["<0xA9>"] = 8;
  t["model"]["vocab"]["<unk>"] = 9;
  t["model"]["unk_token"] = "<unk>";
  t["decoder"] = {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}};
  TempModel m(t);
  const auto tok = Tokenizer::from_directory(m.dir.string());
  CHECK(tok.encode("a\xC3\xA9") == ids({0, 7, 8}));  // "aé"
  CHECK(tok.encode("\xE2\x82\xAC") == ids({9}));     // "€": byte tokens missing -> unk
  CHECK(tok.decode({0, 7, 8}) == "a\xC3\xA9");
  CHECK(tok.decode({7, 0}) == "\xEF\xBF\xBD" "a");   // a lone lead byte: one U+FFFD per byte
}

TEST_CASE("added tokens are split out before the model; single_word, lstrip and rstrip apply") {
  json t = tiny();
  t["added_tokens"] = json::array({
      {{"id", 10}, {"content", "<s>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}},
      {{"id", 11}, {"content", "ab"}, {"single_word", true}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", false}},
      {{"id", 12}, {"content", "<m>"}, {"single_word", false}, {"lstrip", true}, {"rstrip", true}, {"normalized", false}, {"special", true}},
  });
  TempModel m(t);
  const auto tok = Tokenizer::from_directory(m.dir.string());
  CHECK(tok.encode("a<s>bc") == ids({0, 10, 3}));
  CHECK(tok.encode("ab c") == ids({11, 6, 2}));      // "ab" as a whole word
  CHECK(tok.encode("abc") == ids({0, 3}));           // not inside a word
  CHECK(tok.encode("a  <m>  b") == ids({0, 12, 1}));  // spaces around <m> go with it
  CHECK(tok.decode({0, 10, 3}, true) == "a bc");     // special <s> skipped
  CHECK(tok.is_special(10));
  CHECK_FALSE(tok.is_special(11));
  CHECK(tok.vocab_size() == 13);
  CHECK(tok.token_to_id("<s>") == 10);
}

TEST_CASE("add_bos_token / add_eos_token in tokenizer_config.json replace the post-processor, as transformers does") {
  json t = tiny();
  t["added_tokens"] = json::array({{{"id", 10}, {"content", "<s>"}, {"special", true}}, {{"id", 11}, {"content", "</s>"}, {"special", true}}});
  TempModel plain(t);
  CHECK(Tokenizer::from_directory(plain.dir.string()).encode("ab", true) == ids({4}));
  TempModel both(t, json{{"add_bos_token", true}, {"add_eos_token", true}, {"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}});
  const auto tok = Tokenizer::from_directory(both.dir.string());
  CHECK(tok.encode("ab", true) == ids({10, 4, 11}));
  CHECK(tok.encode("ab", false) == ids({4}));
  CHECK(tok.bos_token_id() == 10);
  CHECK(tok.eos_token() == std::optional<std::string>("</s>"));
}

TEST_CASE("decoders: Strip, Replace and Metaspace") {
  json t = tiny();
  t["model"]["vocab"]["\xE2\x96\x81" "a"] = 20;  // "▁a"
  t["decoder"] = {{"type", "Sequence"},
                  {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                                            {{"type", "Fuse"}},
                                            {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  TempModel m(t);
  CHECK(Tokenizer::from_directory(m.dir.string()).decode({20, 20, 1}) == "a ab");
  t["decoder"] = {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}};
  TempModel m2(t);
  // As tokenizers: every ▁ of the first token goes, later ones become spaces.
  CHECK(Tokenizer::from_directory(m2.dir.string()).decode({20, 20, 1}) == "a ab");
}

TEST_CASE("an unsupported component is a ConfigError naming its type and the file") {
  for (auto [key, value, type] : {std::tuple<std::string, json, std::string>{"normalizer", {{"type", "BertNormalizer"}}, "BertNormalizer"},
                                  {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array({{{"type", "Punctuation"}}})}}, "Punctuation"},
                                  {"decoder", {{"type", "WordPiece"}}, "WordPiece"},
                                  {"post_processor", {{"type", "Weird"}}, "Weird"}}) {
    json t = tiny();
    t[key] = value;
    TempModel m(t);
    try {
      Tokenizer::from_directory(m.dir.string());
      FAIL("no error for " << type);
    } catch (const trainrun::v1::ConfigError& e) {
      const std::string msg = e.what();
      CHECK(msg.find("\"" + type + "\"") != std::string::npos);
      CHECK(msg.find((m.dir / "tokenizer.json").string()) != std::string::npos);
      CHECK(msg.find(key) != std::string::npos);
    }
  }
  json t = tiny();
  t["model"]["type"] = "WordPiece";
  TempModel m(t);
  CHECK_THROWS_WITH_AS(Tokenizer::from_directory(m.dir.string()), doctest::Contains("\"WordPiece\""), trainrun::v1::ConfigError);
  json wrong_type = tiny();
  wrong_type["added_tokens"] = json::array({{{"id", 10}, {"content", "<s>"}, {"special", "yes"}}});
  TempModel bad_type(wrong_type);
  CHECK_THROWS_WITH_AS(Tokenizer::from_directory(bad_type.dir.string()), doctest::Contains("tokenizer.json: "), trainrun::v1::ConfigError);
  // Ids past int32 were wrapped by get<int32_t> (and INT32_MAX overflowed the vocabulary size).
  for (const json& id : {json(int64_t{1} << 32), json(int64_t{INT32_MAX}), json(-1)}) {
    json big = tiny();
    big["added_tokens"] = json::array({{{"id", id}, {"content", "<s>"}, {"special", true}}});
    TempModel bad_id(big);
    CHECK_THROWS_WITH_AS(Tokenizer::from_directory(bad_id.dir.string()),
                         doctest::Contains(id.get<int64_t>() < 0 ? "negative id" : "out of range"),
                         trainrun::v1::ConfigError);
  }
  TempModel bad_merge(tiny(json::array({"b q"})));
  CHECK_THROWS_WITH_AS(Tokenizer::from_directory(bad_merge.dir.string()), doctest::Contains("merges[0]: token \"q\""), trainrun::v1::ConfigError);
}

TEST_CASE("a directory with neither tokenizer.json nor a valid tokenizer.model is refused by name") {
  TempModel m(tiny());
  fs::remove(m.dir / "tokenizer.json");
  CHECK_THROWS_WITH_AS(Tokenizer::from_directory(m.dir.string()), doctest::Contains("has neither tokenizer.json nor tokenizer.model"), trainrun::v1::ConfigError);
  std::ofstream(m.dir / "tokenizer.model") << "x";
  // Not a model: the sentencepiece module's refusal (or, where it is not built, the way out).
  CHECK_THROWS_WITH_AS(Tokenizer::from_directory(m.dir.string()), doctest::Contains(((m.dir / "tokenizer.model").string() + ":").c_str()),
                       trainrun::v1::ConfigError);
}

TEST_CASE("invalid UTF-8 input and unknown ids are refused with the position") {
  TempModel m(tiny());
  const auto tok = Tokenizer::from_directory(m.dir.string());
  CHECK_THROWS_WITH_AS(tok.encode("ab\xFF"), doctest::Contains("byte 2"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(tok.decode({0, 99}), doctest::Contains("token id 99 (position 1)"), std::out_of_range);
}

#ifdef TRAINRUN_TOKENIZER_FIXTURES
TEST_CASE("fixture tokenizers: known ids, BOS rules, batch equals single") {
  const std::string root = TRAINRUN_TOKENIZER_FIXTURES;
  const auto mistral = Tokenizer::from_directory(root + "/mistral");
  CHECK(mistral.encode("Hello", true) == ids({1, 22557}));  // <s> ▁Hello (fixtures' README)
  CHECK(mistral.decode(mistral.encode("Hello world", true), true) == "Hello world");
  const auto llama3 = Tokenizer::from_directory(root + "/llama3");
  CHECK(llama3.encode("Hello", true) == llama3.encode("Hello", false));  // this copy adds no BOS
  CHECK(llama3.bos_token() == std::optional<std::string>("<|begin_of_text|>"));
  const auto qwen3 = Tokenizer::from_directory(root + "/qwen3");
  CHECK(qwen3.encode("<|im_start|>user", false).front() == *qwen3.token_to_id("<|im_start|>"));
  CHECK(qwen3.encode("e\xCC\x81") == qwen3.encode("\xC3\xA9"));  // NFC: e + U+0301 == é
  std::vector<std::string> texts;
  for (int k = 0; k < 200; ++k) texts.push_back("text " + std::to_string(k * 7919) + " \xF0\x9F\x98\x80 caf\xC3\xA9 <|im_end|>");
  const auto batch = qwen3.encode_batch(texts, true, 4);
  for (size_t k = 0; k < texts.size(); ++k) CHECK(batch[k] == qwen3.encode(texts[k], true));
}
#endif
