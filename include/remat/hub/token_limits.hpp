#pragma once
/// @file
/// Token limits on chat data: an example longer than `max_tokens` is either truncated by
/// dropping its oldest exchanges (a user turn and the turns up to the next user turn) while
/// keeping a leading system message, or excluded; and a report of what was done and of the
/// data's token-count distribution (min, median, p95, max, measured before any truncation), to
/// print before a run starts.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/hub/chat_tokens.hpp"
#include "remat/hub/conversation.hpp"

namespace remat::hub {

/// What to do with an example longer than the limit.
enum class Truncate {
  oldest,  ///< drop the oldest exchanges, keep the system message (`--truncate oldest`)
  exclude  ///< leave the example out (`--truncate exclude`)
};

/// How chat data becomes training tokens.
struct ChatDataOptions {
  /// The longest example, in tokens.
  std::size_t max_tokens = 1024;
  /// The model's context (0: unknown); `max_tokens` above it is an ArgumentError.
  std::size_t context = 0;
  Truncate truncate = Truncate::oldest;
  TrainOn train_on = TrainOn::assistant;
  /// Skip (and count) the conversations the template refuses (Mistral's: a system message, or
  /// roles that do not alternate) instead of throwing their UnknownRoleError: the data's other
  /// rule, like ReadOptions::skip_bad for malformed lines.
  bool skip_refused = false;
};

/// What limits did to the data, and its token-count distribution.
struct TokenReport {
  std::size_t examples = 0, truncated = 0, excluded = 0;
  /// Conversations the template refused, skipped (ChatDataOptions::skip_refused; not among the
  /// examples), and the first one's error.
  std::size_t refused = 0;
  std::string first_refused;
  /// Token counts of the examples as written (before truncation).
  std::size_t min = 0, median = 0, p95 = 0, max = 0;
  /// Tokens kept, and those of them the loss is on.
  std::size_t tokens = 0, loss_tokens = 0;
  /// Every example's token count as written, sorted: the whole distribution, for choosing a
  /// limit from it (examples/auto_settings.hpp).
  std::vector<std::size_t> counts;
};

/// Examples ready for batching and the report on them.
struct ChatData {
  std::vector<TokenizedExample> examples;
  TokenReport report;
};

namespace detail {

/// The value at quantile `q` (nearest rank) of sorted `v`.
inline std::size_t nearest_rank(const std::vector<std::size_t>& v, double q) {
  if (v.empty()) return 0;
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::clamp<std::size_t>(rank, 1, v.size()) - 1];
}

/// The index of the first message of each exchange after a leading system message.
inline std::vector<std::size_t> exchange_starts(const Conversation& c) {
  std::vector<std::size_t> starts;
  const std::size_t first = !c.messages.empty() && c.messages[0].role == Role::system ? 1 : 0;
  for (std::size_t i = first; i < c.messages.size(); ++i)
    if (i == first || c.messages[i].role == Role::user) starts.push_back(i);
  return starts;
}

/// `c` without the exchanges before `starts[k]` (its leading system message kept).
inline Conversation drop_oldest(const Conversation& c, std::size_t from) {
  Conversation out;
  out.source = c.source;
  if (c.messages[0].role == Role::system) out.messages.push_back(c.messages[0]);
  out.messages.insert(out.messages.end(), c.messages.begin() + static_cast<std::ptrdiff_t>(from),
                      c.messages.end());
  return out;
}

inline bool has_assistant(const Conversation& c) {
  return std::any_of(c.messages.begin(), c.messages.end(),
                     [](const Message& m) { return m.role == Role::assistant; });
}

}  // namespace detail

/// Sets the report's min, median, p95 and max (nearest rank) from the examples' token counts
/// (none: all zero), and keeps the counts, sorted.
inline void set_distribution(TokenReport& r, std::vector<std::size_t> counts) {
  std::sort(counts.begin(), counts.end());
  r.counts = std::move(counts);
  if (r.counts.empty()) return;
  r.min = r.counts.front();
  r.max = r.counts.back();
  r.median = detail::nearest_rank(r.counts, 0.5);
  r.p95 = detail::nearest_rank(r.counts, 0.95);
}

/// Renders, tokenizes and limits `conversations` with template `t` and tokenizer `tok`. An
/// example that no truncation brings under the limit (its last exchange alone is too long) is
/// excluded and counted so; a conversation the template refuses is its UnknownRoleError, or
/// skipped and counted with `skip_refused`. A ArgumentError when `max_tokens` is 0 or above the
/// model's context; an EmptyDataError when nothing is left.
inline ChatData prepare_chat_data(const Tokenizer& tok, const ChatTemplate& t,
                                  const std::vector<Conversation>& conversations,
                                  const ChatDataOptions& o) {
  if (o.max_tokens == 0) throw ArgumentError("hub::prepare_chat_data: max_tokens is 0");
  if (o.context != 0 && o.max_tokens > o.context)
    throw ArgumentError(remat::detail::cat("hub::prepare_chat_data: max_tokens ", o.max_tokens,
                                           " is above the model's context (", o.context,
                                           " positions)"));
  ChatData out;
  std::vector<std::size_t> counts;
  for (const Conversation& c : conversations) {
    RenderedChat rendered;
    try {
      rendered = render_chat(t, c);
    } catch (const UnknownRoleError& e) {
      if (!o.skip_refused) throw;
      if (out.report.refused++ == 0) out.report.first_refused = e.what();
      continue;
    }
    ++out.report.examples;
    TokenizedExample ex = tokenize_chat(tok, rendered, o.train_on);
    counts.push_back(ex.ids.size());
    if (ex.ids.size() > o.max_tokens) {
      bool fits = false;
      if (o.truncate == Truncate::oldest) {
        const std::vector<std::size_t> starts = detail::exchange_starts(c);
        for (std::size_t k = 1; k < starts.size() && !fits; ++k) {
          const Conversation shorter = detail::drop_oldest(c, starts[k]);
          if (!detail::has_assistant(shorter)) break;
          ex = tokenize_chat(tok, render_chat(t, shorter), o.train_on);
          fits = ex.ids.size() <= o.max_tokens;
        }
      }
      if (!fits) {
        ++out.report.excluded;
        continue;
      }
      ++out.report.truncated;
    }
    out.report.tokens += ex.ids.size();
    out.report.loss_tokens +=
        static_cast<std::size_t>(std::count(ex.loss.begin(), ex.loss.end(), 1));
    out.examples.push_back(std::move(ex));
  }
  set_distribution(out.report, std::move(counts));
  if (out.report.examples == 0 && out.report.refused > 0)
    throw EmptyDataError(remat::detail::cat(
        "hub::prepare_chat_data: no example left: the template refused all ", out.report.refused,
        " conversations (the first: ", out.report.first_refused, ")"));
  if (out.examples.empty())
    throw EmptyDataError(remat::detail::cat(
        "hub::prepare_chat_data: no example left: all ", out.report.examples,
        " are longer than max_tokens ", o.max_tokens, " (shortest ", out.report.min, " tokens)",
        o.truncate == Truncate::exclude ? "" : " even truncated",
        out.report.refused > 0
            ? remat::detail::cat(", and the template refused ", out.report.refused, " more")
            : std::string()));
  return out;
}

/// One line for the user: "N examples, T truncated, E excluded; tokens min/median/p95/max", and
/// the conversations the template refused when some were skipped.
inline std::string describe(const TokenReport& r) {
  return remat::detail::cat(
      r.examples, " examples: ", r.truncated, " truncated, ", r.excluded,
      " excluded; tokens per example min ", r.min, ", median ", r.median, ", p95 ", r.p95, ", max ",
      r.max, "; ", r.tokens, " tokens kept, ", r.loss_tokens, " in the loss",
      r.refused > 0
          ? remat::detail::cat("; ", r.refused,
                               " conversations the chat template refuses skipped (the first: ",
                               r.first_refused, ")")
          : std::string());
}

}  // namespace remat::hub
