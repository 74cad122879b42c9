#pragma once
/// @file
/// A conversation as training tokens: the ids of its rendered text (the chat template's
/// rendering, encoded as transformers' apply_chat_template does: without the post-processor's
/// special tokens, since the template writes them) and a per-token loss mask that is true on
/// assistant tokens. A token belongs to the loss when any of its bytes lies in an assistant span
/// (chat_template.hpp): content and the end marker that follows it.
///
/// The tokenizer gives no offsets, so each span boundary is located by encoding the text up to
/// it and comparing with the whole text's ids: the tokens the two share are wholly before the
/// boundary. The cost is one extra encode of a prefix per boundary (two per assistant turn).

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <vector>

#include "remat/hub/chat_template.hpp"
#include "remat/hub/tokenizer.hpp"

namespace remat::hub {

/// Which tokens the loss is on.
enum class TrainOn {
  assistant,  ///< assistant content only (the default)
  all         ///< every token (`--train-on all`)
};

/// One example as tokens: `ids` and `loss[i]` (1: the loss is on token i, as a target).
struct TokenizedExample {
  std::vector<std::int32_t> ids;
  std::vector<std::uint8_t> loss;
};

namespace detail {

/// The number of leading tokens of `whole` that lie wholly before byte `at` of `text`, and
/// whether a token of `whole` straddles `at`.
inline std::pair<std::size_t, bool> tokens_before(const Tokenizer& tok, std::string_view text,
                                                  std::size_t at,
                                                  const std::vector<std::int32_t>& whole) {
  if (at == 0) return {0, false};
  if (at >= text.size()) return {whole.size(), false};
  const std::vector<std::int32_t> prefix = tok.encode(text.substr(0, at), false);
  const auto [a, b] = std::mismatch(prefix.begin(), prefix.end(), whole.begin(), whole.end());
  const auto shared = static_cast<std::size_t>(a - prefix.begin());
  // Everything up to the boundary encodes alike: the next token of `whole` starts at `at`.
  return {shared, shared < prefix.size()};
}

}  // namespace detail

/// Encodes `rendered` with `tok` and marks the tokens overlapping an assistant span (every
/// token with `TrainOn::all`).
inline TokenizedExample tokenize_chat(const Tokenizer& tok, const RenderedChat& rendered,
                                      TrainOn train_on = TrainOn::assistant) {
  TokenizedExample ex;
  ex.ids = tok.encode(rendered.text, false);
  ex.loss.assign(ex.ids.size(), train_on == TrainOn::all ? 1 : 0);
  if (train_on == TrainOn::all) return ex;
  for (const RenderedChat::Span& span : rendered.assistant) {
    if (span.end <= span.begin) continue;
    const std::size_t first = detail::tokens_before(tok, rendered.text, span.begin, ex.ids).first;
    const auto [before_end, straddles] =
        detail::tokens_before(tok, rendered.text, span.end, ex.ids);
    const std::size_t last = std::min(ex.ids.size(), before_end + (straddles ? 1 : 0));
    for (std::size_t i = first; i < last; ++i) ex.loss[i] = 1;
  }
  return ex;
}

/// Encodes a plain text document (the loss on every token) as TRL's SFTTrainer does: the
/// special tokens transformers' tokenizer adds (Tokenizer::encode_for_model: bos for Llama 2 and
/// 3), and eos last so the model learns where documents end, unless the text already ends with
/// eos's text (TRL appends it to the text only then).
inline TokenizedExample tokenize_document(const Tokenizer& tok, std::string_view text) {
  TokenizedExample ex;
  ex.ids = tok.encode_for_model(text);
  const auto eos = tok.eos_id();
  if (eos && !text.ends_with(tok.config().eos_token.value_or(""))) ex.ids.push_back(*eos);
  ex.loss.assign(ex.ids.size(), 1);
  return ex;
}

}  // namespace remat::hub
