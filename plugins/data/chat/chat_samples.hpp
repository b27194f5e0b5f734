#pragma once
// The `chat` dataset without LibTorch: reading conversation files (OpenAI messages, ShareGPT
// conversations, Alpaca records), rendering them with a chat template, tokenizing, and marking
// which next-token targets count in the loss. chat.cpp packs the samples into batches; the test
// tool tests/tools/chat_dump.cpp prints them for comparison with transformers.
#include <trainrun/text/chat_template.hpp>
#include <trainrun/text/tokenizer.hpp>

#include <array>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace trainrun::chat {

/// glob(3)-expands `patterns` (brace and tilde expansion; option `key` of the table `context`)
/// into files, in order. Throws v1::ConfigError naming the table, the key and the pattern for a
/// pattern that matches nothing or cannot be expanded, or a match that is a folder. An empty
/// list gives no files: the caller says what it needs. Shared with the `preference` dataset.
std::vector<std::string> expand_paths(const std::vector<std::string>& patterns,
                                      const std::string& context, const std::string& key);

/// Length of the common prefix of two token id sequences.
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b);

/// A permutation of 0..n-1 drawn by Fisher-Yates from mt19937_64(seed): the held-out choice of
/// the datasets (std::shuffle's algorithm is not specified, so it could differ between standard
/// libraries; this one does not).
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

/// [train, held out]: `items` with fraction * items.size() of them (rounded down) held out, those
/// at the first places of seeded_permutation(seed), each part sorted. Throws v1::ConfigError
/// "CONTEXT: validation_fraction leaves no training UNIT" when none is left to train on. Shared
/// with the `preference` and `unpaired` datasets.
std::array<std::vector<int64_t>, 2> hold_out(const std::vector<int64_t>& items, double fraction,
                                             uint64_t seed, const std::string& context,
                                             const std::string& unit);

/// The bytes of the file `path`. Throws v1::ConfigError "WHO: cannot open 'PATH': REASON".
std::string read_file(const std::string& path, const std::string& who);

/// Calls f(line, record) for every non-blank line of `text`, the JSONL file `file` (line 1-based),
/// in order. Throws v1::ConfigError "FILE:LINE: ..." for a line that is not JSON or is nested
/// deeper than v1::kMaxJsonDepth. Shared with the `preference` dataset.
void for_each_jsonl_record(const std::string& file, const std::string& text,
                           const std::function<void(int64_t, const nlohmann::ordered_json&)>& f);

/// One conversation as read, with where it came from (for errors).
struct Conversation {
  std::string file;
  int64_t line = 0;            ///< 1-based line (JSONL) or record number (JSON array)
  std::string where() const;   ///< "FILE:LINE" or "FILE: record N"
  bool jsonl = true;
  nlohmann::ordered_json messages;  ///< [{role, content}, ...] with roles system/user/assistant/tool
};

/// Reads `files` (JSONL: one object per line, blank lines skipped; or a .json file holding an
/// array of objects). Each object is OpenAI-style {"messages": [{"role", "content"}]}, ShareGPT
/// {"conversations": [{"from", "value"}]} (human/user, gpt/assistant, system, tool) or Alpaca
/// {"instruction", "input"?, "output", "system"?} (user = instruction, plus "\n\n" + input
/// when non-empty; assistant = output). Throws v1::ConfigError naming the file and line (or
/// record) and the key for malformed JSON, a missing or mistyped key, or an unknown role.
std::vector<Conversation> read_conversations(const std::vector<std::string>& files);

/// Which targets count in the loss.
enum class TrainOn { Assistant, Last, All };

/// A rendered, tokenized conversation. ids are the template's text tokenized without adding
/// special tokens (as apply_chat_template(tokenize=True)); counted[j] says whether token j is a
/// target the loss counts (token 0 never is: nothing predicts it).
struct ChatSample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> counted;
  int64_t num_counted() const;
};

/// Renders and tokenizes `conv` and marks its trained tokens.
///
/// Assistant spans: with a template that marks them ({% generation %}), the generation blocks'
/// text; otherwise, for assistant message i, the text between the rendering of messages[:i]
/// with add_generation_prompt (the prompt up to the assistant header) and the rendering of
/// messages[:i+1] (through the end of the turn: end-of-turn / EOS token included). Both must be
/// prefixes of the full rendering, else the template renders earlier turns differently from its
/// prefixes and the error says so. A character position c becomes a token index by tokenizing
/// text[:c] and taking the length of its common prefix with the full ids. train_on = Last keeps
/// only the last assistant span; All counts every token but the first.
/// Throws v1::ConfigError naming conv.where(): no assistant turn (Assistant/Last), a template
/// error (raise_exception included), a rendering that starts with BOS twice.
ChatSample render_sample(const Conversation& conv, const text::ChatTemplate& tmpl,
                         const text::Tokenizer& tok, TrainOn train_on);

}  // namespace trainrun::chat
