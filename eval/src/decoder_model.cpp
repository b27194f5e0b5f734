// DecoderLanguageModel (decoder_model.hpp): lm-eval 0.4.13's HFLM over a model plugin's
// PaddedDecoder (models/huggingface.py, api/model.py): contexts tokenized with the tokenizer's
// special tokens unless they start with the BOS text, a context's trailing whitespace moved to
// the continuation, the continuation's tokens taken from the encoding of the whole, an empty
// context replaced by the prefix token (BOS, else EOS), inputs cut to the model's max length from
// the left, rolling windows of max length for perplexity, greedy generation cut at the stop
// strings and the EOS text. Requests run in batches of similar length (left-padded, longest
// first).
#include "trainrun/eval/decoder_model.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <numeric>

#include "trainrun/batch_generation.hpp"
#include "trainrun/error.hpp"
#include "trainrun/generation.hpp"
#include "trainrun/text/tokenizer.hpp"

namespace fs = std::filesystem;

namespace trainrun::eval {

using v1::ConfigError;

int64_t model_max_length(const fs::path& dir) {
  std::ifstream f(dir / "config.json");
  Json c;
  try {
    c = Json::parse(f);
  } catch (const Json::exception& e) {
    throw ConfigError((dir / "config.json").string() + ": not valid JSON: " + e.what());
  }
  const Json& t = c.contains("text_config") && c["text_config"].is_object() ? c["text_config"] : c;
  for (const char* k : {"n_positions", "max_position_embeddings", "n_ctx"})
    if (t.contains(k) && t[k].is_number_integer()) return t[k].get<int64_t>();
  return 2048;
}

std::set<int64_t> generation_eos_ids(const fs::path& dir, const text::Tokenizer& tok) {
  std::set<int64_t> out;
  auto add = [&](const Json& v, const fs::path& file) {
    if (v.is_number_integer()) {
      out.insert(v.get<int64_t>());
    } else if (v.is_array()) {
      for (const auto& e : v) {
        if (!e.is_number_integer())
          throw ConfigError(file.string() + ": \"eos_token_id\" holds " + e.dump());
        out.insert(e.get<int64_t>());
      }
    } else if (!v.is_null()) {
      throw ConfigError(file.string() + ": \"eos_token_id\" must be an integer or a list, got " +
                        v.dump());
    }
  };
  for (const char* name : {"generation_config.json", "config.json"}) {
    const fs::path p = dir / name;
    if (!fs::is_regular_file(p)) continue;
    std::ifstream f(p);
    Json j;
    try {
      j = Json::parse(f);
    } catch (const Json::exception& e) {
      throw ConfigError(p.string() + ": not valid JSON: " + e.what());
    }
    if (j.contains("eos_token_id")) {
      add(j["eos_token_id"], p);
      break;
    }
  }
  if (auto e = tok.eos_token_id()) out.insert(*e);
  return out;
}

std::string completion_text(const text::Tokenizer& tok, const std::vector<int64_t>& ids) {
  std::vector<int32_t> out32;
  for (int64_t id : ids)
    if (id < tok.vocab_size()) out32.push_back(static_cast<int32_t>(id));
  return tok.decode(out32, /*skip_special_tokens=*/true);
}

namespace {

class PluginLanguageModel final : public DecoderLanguageModel {
 public:
  PluginLanguageModel(const text::Tokenizer& tok, v1::IncrementalDecoder& dec, int64_t max_length,
                      int64_t batch_size, std::set<int64_t> eos, std::string label)
      : tok_(tok),
        dec_(dec),
        padded_(padded_of(dec, label)),
        repeat_(dynamic_cast<v1::DecodeStateRepeat*>(&dec)),
        max_length_(max_length),
        batch_size_(batch_size),
        eos_(std::move(eos)),
        label_(std::move(label)) {
    const auto bos = tok.bos_token_id();
    const auto eos_id = tok.eos_token_id();
    if (!bos && !eos_id)
      throw ConfigError("the tokenizer has neither a BOS nor an EOS token to condition on");
    prefix_id_ = bos ? *bos : *eos_id;
    prefix_text_ = tok.decode({static_cast<int32_t>(prefix_id_)}, false);
    eos_text_ = eos_id ? tok.decode({*eos_id}, false) : std::string();
    bos_text_ = tok.bos_token().value_or("");
    pad_id_ = tok.pad_token_id() ? *tok.pad_token_id() : (eos_.empty() ? 0 : *eos_.begin());
  }

  void loglikelihood(const std::vector<Request*>& requests) override {
    std::vector<Scored> items;
    for (Request* r : requests) {
      std::vector<int64_t> ctx, cont;
      if (r->context.empty()) {
        cont = ids(tok_.encode(r->continuation, false));
        if (cont.empty())
          throw ConfigError("a continuation encodes to no tokens: \"" + r->continuation + "\"");
        if (cont[0] != prefix_id_)
          ctx = {prefix_id_};
        else {
          ctx = {cont[0]};
          cont.erase(cont.begin());
        }
      } else {
        std::string context = r->context, continuation = r->continuation;
        const size_t n = eval::trailing_whitespace_bytes(context);
        if (n > 0) {
          continuation = context.substr(context.size() - n) + continuation;
          context.resize(context.size() - n);
        }
        const std::vector<int64_t> whole = tok_encode(context + continuation);
        ctx = tok_encode(context);
        cont.assign(whole.begin() + static_cast<std::ptrdiff_t>(std::min(ctx.size(), whole.size())),
                    whole.end());
      }
      if (cont.empty())
        throw ConfigError("a continuation adds no tokens to its context: \"" + r->continuation +
                          "\"");
      items.push_back({std::move(ctx), std::move(cont), &r->loglikelihood, &r->is_greedy});
    }
    score(items);
  }

  void loglikelihood_rolling(const std::vector<Request*>& requests) override {
    std::vector<Scored> items;
    std::vector<std::pair<Request*, std::vector<double>>> parts;
    parts.reserve(requests.size());
    for (Request* r : requests) {
      const std::vector<int64_t> t = tok_encode(r->continuation);
      parts.push_back({r, {}});
      const int64_t n = static_cast<int64_t>(t.size());
      if (n == 0) continue;
      std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> windows;
      const int64_t first = std::min(max_length_, n);
      std::vector<int64_t> c0 = {prefix_id_};
      c0.insert(c0.end(), t.begin(), t.begin() + first - 1);
      windows.push_back({c0, std::vector<int64_t>(t.begin(), t.begin() + first)});
      for (int64_t predicted = first; predicted < n;) {
        const int64_t len = std::min(n - predicted, max_length_);
        const int64_t end = predicted + len;
        std::vector<int64_t> ctx(t.begin() + (end - max_length_ - 1), t.begin() + (end - 1));
        windows.push_back({ctx, std::vector<int64_t>(t.begin() + (end - len), t.begin() + end)});
        predicted += len;
      }
      parts.back().second.resize(windows.size());
      for (size_t w = 0; w < windows.size(); ++w) {
        auto& [ctx, cont] = windows[w];
        ctx.resize(ctx.size() - (cont.size() - 1));  // make_disjoint_window
        items.push_back({std::move(ctx), std::move(cont), &parts.back().second[w], nullptr});
      }
    }
    score(items);
    for (auto& [r, lls] : parts) r->loglikelihood = std::accumulate(lls.begin(), lls.end(), 0.0);
  }

  void generate_until(const std::vector<Request*>& requests) override {
    // Batches share their stop strings and length, longest prompt first (lm-eval groups by
    // generation_kwargs and sorts so).
    std::map<std::pair<std::vector<std::string>, int64_t>, std::vector<Request*>> groups;
    for (Request* r : requests) groups[{r->until, r->max_gen_toks}].push_back(r);
    for (auto& [key, group] : groups) {
      const int64_t max_new = key.second;
      std::vector<std::string> until = key.first;
      if (!eos_text_.empty() && std::find(until.begin(), until.end(), eos_text_) == until.end())
        until.push_back(eos_text_);
      const int64_t max_ctx = max_length_ - max_new;
      if (max_ctx <= 0)
        throw ConfigError("max_gen_toks " + std::to_string(max_new) +
                          " leaves no room for a prompt in the model's max length " +
                          std::to_string(max_length_));
      std::vector<std::pair<std::vector<int64_t>, Request*>> prompts;
      for (Request* r : group) {
        // tok_batch_encode: special tokens unless the prompt starts with the BOS text.
        const bool add = bos_text_.empty() || r->context.rfind(bos_text_, 0) != 0;
        std::vector<int64_t> p = ids(tok_.encode(r->context, add));
        if (static_cast<int64_t>(p.size()) > max_ctx) p.erase(p.begin(), p.end() - max_ctx);
        if (p.empty()) throw ConfigError("a generation prompt encodes to no tokens");
        prompts.push_back({std::move(p), r});
      }
      std::stable_sort(prompts.begin(), prompts.end(), [](const auto& a, const auto& b) {
        return a.first.size() > b.first.size();
      });
      for (size_t b = 0; b < prompts.size(); b += static_cast<size_t>(batch_size_)) {
        const size_t e = std::min(prompts.size(), b + static_cast<size_t>(batch_size_));
        v1::GenerationRequest req;
        for (size_t k = b; k < e; ++k) req.prompts.push_back(prompts[k].first);
        req.max_completion_length = max_new;
        req.eos_token_ids.assign(eos_.begin(), eos_.end());
        req.pad_token_id = pad_id_;
        req.stop = [&](int64_t, const std::vector<int64_t>& done) {
          const std::string t = completion_text(tok_, done);
          return std::any_of(until.begin(), until.end(), [&](const std::string& s) {
            return !s.empty() && t.find(s) != std::string::npos;
          });
        };
        v1::GenerationResult res;
        try {
          res = v1::generate_batch(dec_, req);
        } catch (const c10::Error& err) {
          throw std::runtime_error(label_ + ": generation failed: " + err.what_without_backtrace());
        }
        for (size_t k = b; k < e; ++k) {
          std::string t = completion_text(tok_, res.completions[k - b].ids);
          for (const std::string& s : until)
            if (!s.empty()) {
              const size_t at = t.find(s);
              if (at != std::string::npos) t.resize(at);
            }
          prompts[k].second->text = t;
        }
        generated_tokens_ += res.decode_tokens + static_cast<int64_t>(e - b);
      }
    }
  }

  int64_t scored_tokens() const override { return scored_tokens_; }
  int64_t generated_tokens() const override { return generated_tokens_; }

 private:
  static v1::PaddedDecoder& padded_of(v1::IncrementalDecoder& dec, const std::string& label) {
    auto* p = dynamic_cast<v1::PaddedDecoder*>(&dec);
    if (p == nullptr)
      throw ConfigError(label +
                        " does not offer batched decoding (v1::PaddedDecoder), which "
                        "the evaluation scores with");
    return *p;
  }

  struct Scored {
    std::vector<int64_t> ctx, cont;
    double* ll;
    bool* greedy;
  };

  static std::vector<int64_t> ids(const std::vector<int32_t>& v) {
    return std::vector<int64_t>(v.begin(), v.end());
  }
  std::vector<int64_t> tok_encode(const std::string& s) const {
    // HFLM.tok_encode: special tokens as the tokenizer adds them, unless s starts with the
    // prefix token's text.
    const bool add = prefix_text_.empty() || s.rfind(prefix_text_, 0) != 0;
    return ids(tok_.encode(s, add));
  }
  // Row r of a left-padded batch: `ids` at its right end, marked real in `mask`.
  static void put_left(at::Tensor& input, at::Tensor& mask, int64_t r,
                       const std::vector<int64_t>& ids) {
    const int64_t width = input.size(1), len = static_cast<int64_t>(ids.size());
    input[r].slice(0, width - len, width).copy_(at::tensor(ids, at::kLong));
    mask[r].slice(0, width - len, width).fill_(1);
  }
  // The continuation log-likelihoods of `items`. Requests that share their context (a multiple-
  // choice document's choices) prefill it once and continue each choice from a copy of its keys
  // and values (DecodeStateRepeat); lm-eval runs the context once per choice. The others run
  // whole. Both give the full forward's logits to rounding.
  void score(std::vector<Scored>& items) {
    std::map<std::vector<int64_t>, std::vector<size_t>> by_context;
    std::vector<size_t> whole;
    for (size_t i = 0; i < items.size(); ++i) {
      const bool fits =
          static_cast<int64_t>(items[i].ctx.size() + items[i].cont.size()) <= max_length_ + 1;
      if (repeat_ && fits)
        by_context[items[i].ctx].push_back(i);
      else
        whole.push_back(i);
    }
    std::map<size_t, std::vector<const std::vector<size_t>*>> shared;  // by choices per context
    // Sharing pays where a context of some length is scored several times; every rolling
    // window starting a text has the one-token context [BOS], which is not worth it.
    for (const auto& [ctx, group] : by_context) {
      if (group.size() >= 2 && ctx.size() >= 4 &&
          static_cast<int64_t>(group.size()) <= 4 * batch_size_)
        shared[group.size()].push_back(&group);
      else
        whole.insert(whole.end(), group.begin(), group.end());
    }
    for (auto& [n, groups] : shared) score_shared(items, n, groups);
    std::sort(whole.begin(), whole.end());
    score_whole(items, whole);
  }

  // Groups of `n` requests with one context each: contexts left-padded and prefilled together,
  // each row repeated n times, then every continuation but its last token decoded, right-padded
  // (a real token never attends to a later slot, so the padding after it changes nothing).
  void score_shared(std::vector<Scored>& items, size_t n,
                    std::vector<const std::vector<size_t>*>& groups) {
    std::stable_sort(groups.begin(), groups.end(), [&](const auto* a, const auto* b) {
      return items[a->front()].ctx.size() > items[b->front()].ctx.size();
    });
    constexpr double kLogitBytes = 1024.0 * 1024 * 1024;
    const int64_t rows_cap = std::max<int64_t>(1, 4 * batch_size_ / static_cast<int64_t>(n));
    for (size_t b = 0; b < groups.size();) {
      const int64_t width = static_cast<int64_t>(items[groups[b]->front()].ctx.size());
      auto tail_of = [&](size_t g) {
        int64_t t = 0;
        for (size_t k : *groups[g])
          t = std::max<int64_t>(t, static_cast<int64_t>(items[k].cont.size()) - 1);
        return t;
      };
      int64_t tail_max = tail_of(b);
      size_t e = b + 1;
      // Logits of the prefill [G, width, V] and of the continuations [G n, tail, V] under 1 GiB.
      while (e < groups.size() && static_cast<int64_t>(e - b) < rows_cap) {
        const int64_t t = std::max(tail_max, tail_of(e));
        const double rows = static_cast<double>(e - b + 1);
        if (rows * (width + static_cast<double>(n) * t) * vocab_guess_ * 4 > kLogitBytes) break;
        tail_max = t;
        ++e;
      }
      const int64_t G = static_cast<int64_t>(e - b), R = G * static_cast<int64_t>(n);
      const int64_t tail = tail_max;  // continuation tokens decoded after the prefill, at most
      at::Tensor input = at::full({G, width}, pad_id_, at::kLong);
      at::Tensor mask = at::zeros({G, width}, at::kLong);
      for (int64_t g = 0; g < G; ++g) {
        const std::vector<int64_t>& ctx = items[groups[b + g]->front()].ctx;
        put_left(input, mask, g, ctx);
        scored_tokens_ += static_cast<int64_t>(ctx.size());
      }
      at::Tensor first, rest;
      try {
        auto state = dec_.new_decode_state(G, width + tail);
        first = v1::decode_padded_last(padded_, input, mask, *state, 1).select(1, 0);  // [G, V]
        vocab_guess_ = first.size(-1);
        if (tail > 0) {
          repeat_->repeat_rows(*state, static_cast<int64_t>(n));
          at::Tensor ids = at::full({R, tail}, pad_id_, at::kLong);
          at::Tensor more = at::zeros({R, tail}, at::kLong);
          for (int64_t g = 0; g < G; ++g)
            for (size_t j = 0; j < n; ++j) {
              const std::vector<int64_t>& cont = items[(*groups[b + g])[j]].cont;
              const int64_t len = static_cast<int64_t>(cont.size()) - 1;
              if (len == 0) continue;
              const int64_t r = g * static_cast<int64_t>(n) + static_cast<int64_t>(j);
              ids[r].slice(0, 0, len).copy_(
                  at::tensor(std::vector<int64_t>(cont.begin(), cont.end() - 1), at::kLong));
              more[r].slice(0, 0, len).fill_(1);
              scored_tokens_ += len;
            }
          rest = padded_.decode_padded(
              ids, at::cat({mask.repeat_interleave(static_cast<int64_t>(n), 0), more}, 1),
              *state);  // [R, tail, V]
        }
      } catch (const c10::Error& err) {
        throw std::runtime_error(label_ + ": forward failed: " + err.what_without_backtrace());
      }
      for (int64_t g = 0; g < G; ++g)
        for (size_t j = 0; j < n; ++j) {
          Scored& it = items[(*groups[b + g])[j]];
          const int64_t c = static_cast<int64_t>(it.cont.size());
          at::Tensor logits = first[g].unsqueeze(0);
          if (c > 1)
            logits = at::cat(
                {logits,
                 rest[g * static_cast<int64_t>(n) + static_cast<int64_t>(j)].slice(0, 0, c - 1)},
                0);
          pick(it, logits);
        }
      b = e;
    }
  }

  // The log-likelihood of `it`'s continuation from the logits [c, V] that predict its tokens.
  static void pick(Scored& it, const at::Tensor& logits) {
    const at::Tensor lp = at::log_softmax(logits.to(at::kFloat), -1);
    const at::Tensor target = at::tensor(it.cont, at::kLong);
    *it.ll = lp.gather(1, target.unsqueeze(1)).squeeze(1).sum().item<float>();
    if (it.greedy) *it.greedy = at::equal(lp.argmax(-1), target);
  }

  // Requests `which` of `items` run whole: inputs (ctx + cont)[-(max+1):][:-1], longest first,
  // left-padded batches whose logits stay under 1 GiB.
  void score_whole(std::vector<Scored>& items, const std::vector<size_t>& which) {
    std::vector<size_t> order(which);
    auto input_len = [&](size_t i) {
      return std::min<int64_t>(static_cast<int64_t>(items[i].ctx.size() + items[i].cont.size()),
                               max_length_ + 1) -
             1;
    };
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return input_len(a) > input_len(b); });
    constexpr double kLogitBytes = 1024.0 * 1024 * 1024;
    for (size_t b = 0; b < order.size();) {
      const int64_t width = input_len(order[b]);
      size_t e = b + 1;
      while (e < order.size() && static_cast<int64_t>(e - b) < batch_size_ &&
             static_cast<double>(e - b + 1) * width * vocab_guess_ * 4 <= kLogitBytes)
        ++e;
      const int64_t rows = static_cast<int64_t>(e - b);
      // Rows end together (left padding): the last `keep` slots hold every continuation.
      int64_t keep = 1;
      for (size_t k = b; k < e; ++k)
        keep = std::max<int64_t>(keep, static_cast<int64_t>(items[order[k]].cont.size()));
      keep = std::min(keep, width);
      at::Tensor input = at::full({rows, width}, pad_id_, at::kLong);
      at::Tensor mask = at::zeros({rows, width}, at::kLong);
      for (int64_t r = 0; r < rows; ++r) {
        const Scored& it = items[order[b + r]];
        std::vector<int64_t> all(it.ctx);
        all.insert(all.end(), it.cont.begin(), it.cont.end());
        if (static_cast<int64_t>(all.size()) > max_length_ + 1)
          all.erase(all.begin(), all.end() - (max_length_ + 1));
        all.pop_back();
        put_left(input, mask, r, all);
        scored_tokens_ += static_cast<int64_t>(all.size());
      }
      at::Tensor logits;
      try {
        auto state = dec_.new_decode_state(rows, width);
        logits = v1::decode_padded_last(padded_, input, mask, *state, keep);  // [rows, keep, V]
      } catch (const c10::Error& err) {
        throw std::runtime_error(label_ + ": forward failed: " + err.what_without_backtrace());
      }
      vocab_guess_ = logits.size(-1);
      for (int64_t r = 0; r < rows; ++r) {
        Scored& it = items[order[b + r]];
        const int64_t c = static_cast<int64_t>(it.cont.size());
        pick(it, logits[r].slice(0, keep - c, keep));
      }
      b = e;
    }
  }

  const text::Tokenizer& tok_;
  v1::IncrementalDecoder& dec_;
  v1::PaddedDecoder& padded_;
  v1::DecodeStateRepeat* repeat_;  // null: every request is scored whole
  int64_t max_length_, batch_size_;
  std::set<int64_t> eos_;
  std::string label_;
  int64_t prefix_id_ = 0, pad_id_ = 0;
  std::string prefix_text_, eos_text_;
  std::string bos_text_;
  int64_t vocab_guess_ = 32000;
  int64_t scored_tokens_ = 0, generated_tokens_ = 0;
};

}  // namespace

std::unique_ptr<DecoderLanguageModel> make_decoder_language_model(
    const text::Tokenizer& tok, v1::IncrementalDecoder& decoder, int64_t max_length,
    int64_t batch_size, std::set<int64_t> eos, std::string label) {
  return std::make_unique<PluginLanguageModel>(tok, decoder, max_length, batch_size, std::move(eos),
                                               std::move(label));
}

}  // namespace trainrun::eval
