// preference_dump: what the `preference` dataset makes of preference files, for comparison with
// TRL's DPOTrainer, CPOTrainer and ORPOTrainer (tests/e2e/preference_data_ref.py). No LibTorch.
//   preference_dump --tokenizer DIR [--template NAME] [--max-length N] [--truncation-mode
//                   keep_start|keep_end] [--max-prompt-length N] [--pad ID] [--trainer
//                   dpo|cpo|orpo] [--batch] FILE...
// One JSON line per pair: {"where": "FILE:LINE", "prompt_ids", "chosen_ids", "rejected_ids",
// "verdict": "keep" | "prompt_fills_max_length" | "no_counted_target"} (prompt_ids after
// --max-prompt-length; with --trainer cpo|orpo also "rejected_prompt_ids" when the rejected
// sequence's prompt differs), or {"where", "error": MESSAGE} when the pair cannot be tokenized.
// --trainer is the dataset's option `trainer` (default dpo). With
// --batch a last line {"batch": {"rows", "width", "input", "target", "num_tokens"}}: the kept pairs
// as one batch (input and target [rows][width], ignored targets -100; 3 rows per pair with
// --trainer orpo). --max-length defaults to
// 0 (none). Exit 2 when the files cannot be read (the message names FILE:LINE and the field).
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/preference/preference_samples.hpp"

using namespace trainrun;

int main(int argc, char** argv) {
  std::string dir, name, mode = "keep_start", trainer = "dpo";
  int64_t max_length = 0, max_prompt_length = 0, pad = -1;
  bool batch = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tokenizer" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--template" && i + 1 < argc)
      name = argv[++i];
    else if (a == "--max-length" && i + 1 < argc)
      max_length = std::stoll(argv[++i]);
    else if (a == "--truncation-mode" && i + 1 < argc)
      mode = argv[++i];
    else if (a == "--max-prompt-length" && i + 1 < argc)
      max_prompt_length = std::stoll(argv[++i]);
    else if (a == "--pad" && i + 1 < argc)
      pad = std::stoll(argv[++i]);
    else if (a == "--trainer" && i + 1 < argc)
      trainer = argv[++i];
    else if (a == "--batch")
      batch = true;
    else
      files.push_back(a);
  }
  if (dir.empty() || files.empty() || (mode != "keep_start" && mode != "keep_end") ||
      (trainer != "dpo" && trainer != "cpo" && trainer != "orpo")) {
    std::cerr << "usage: preference_dump --tokenizer DIR [--template NAME] [--max-length N] "
                 "[--truncation-mode keep_start|keep_end] [--max-prompt-length N] [--pad ID] "
                 "[--trainer dpo|cpo|orpo] [--batch] FILE...\n";
    return 2;
  }
  try {
    const text::Tokenizer tok = text::Tokenizer::from_directory(dir);
    const std::vector<preference::Row> rows = preference::read_rows(files);
    std::unique_ptr<text::ChatTemplate> tmpl;
    for (const auto& r : rows)
      if (r.conversational && !tmpl)
        tmpl = std::make_unique<text::ChatTemplate>(text::load_chat_template(dir, name));
    preference::Limits limits;
    limits.max_length = max_length;
    limits.keep_end = mode == "keep_end";
    limits.max_prompt_length = max_prompt_length;
    std::vector<preference::Pair> kept;
    for (const auto& r : rows) {
      nlohmann::json out = {{"where", r.where()}};
      try {
        preference::Pair p = trainer == "dpo" ? preference::tokenize_row(r, tok, tmpl.get())
                                              : preference::tokenize_row_cpo(r, tok, tmpl.get());
        preference::clip_prompt(p, limits);
        const preference::Verdict v = preference::verdict(p, limits);
        out["prompt_ids"] = p.prompt_ids;
        out["chosen_ids"] = p.chosen_ids;
        out["rejected_ids"] = p.rejected_ids;
        if (p.rejected_prompt_ids) out["rejected_prompt_ids"] = *p.rejected_prompt_ids;
        out["verdict"] = v == preference::Verdict::Keep ? "keep"
                         : v == preference::Verdict::PromptFillsMaxLength
                             ? "prompt_fills_max_length"
                             : "no_counted_target";
        if (v == preference::Verdict::Keep) kept.push_back(std::move(p));
      } catch (const std::exception& e) {
        out["error"] = e.what();
      }
      std::cout << out.dump() << "\n";
    }
    if (batch) {
      std::vector<const preference::Pair*> ptrs;
      for (const auto& p : kept) ptrs.push_back(&p);
      const int32_t pad_id = pad >= 0 ? static_cast<int32_t>(pad)
                                      : tok.pad_token_id().value_or(tok.eos_token_id().value_or(0));
      const preference::Collated c =
          preference::collate(ptrs, limits, pad_id, -100, trainer == "orpo");
      nlohmann::json input = nlohmann::json::array(), target = nlohmann::json::array();
      for (int64_t r = 0; r < c.rows; ++r) {
        const auto at = c.input.begin() + r * c.width;
        input.push_back(std::vector<int64_t>(at, at + c.width));
        const auto tt = c.target.begin() + r * c.width;
        target.push_back(std::vector<int64_t>(tt, tt + c.width));
      }
      std::cout << nlohmann::json{{"batch",
                                   {{"rows", c.rows},
                                    {"width", c.width},
                                    {"input", input},
                                    {"target", target},
                                    {"num_tokens", c.num_tokens}}}}
                       .dump()
                << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "preference_dump: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
