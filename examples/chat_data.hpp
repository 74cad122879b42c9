#pragma once
// finetune's data when --base is a Hugging Face folder: the folder's tokenizer and chat template,
// a JSONL file of conversations or a plain text file, token limits, a validation split, and
// padded batches whose loss is on the tokens the model should learn. remat/hub does the work;
// this file chooses how finetune uses it.
#include <remat/hub/chat_tokens.hpp>
#include <remat/hub/conversation.hpp>
#include <remat/hub/packing.hpp>
#include <remat/hub/token_limits.hpp>
#include <remat/hub/tokenizer.hpp>
#include <remat/remat.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace chat {

namespace hub = remat::hub;

/// How finetune reads a data file (its flags).
struct DataOptions {
  std::string path;
  std::size_t max_tokens = 1024;
  hub::Truncate truncate = hub::Truncate::oldest;
  hub::TrainOn train_on = hub::TrainOn::assistant;
  /// Skip malformed lines and the conversations the chat template refuses (counted).
  bool skip_bad = false;
  /// The date a Llama 3.1+ template writes in its system block (empty: the template's own).
  std::string chat_date;
  /// The flags given that only conversations take (--truncate, --train-on, --skip-bad,
  /// --chat-date): plain text refuses them rather than ignore them.
  std::vector<std::string> conversation_flags;
};

/// One micro-batch: the model's ids and targets (kIgnoreTarget where the loss is not), the
/// first position of each position's example (packed rows; undefined when every row holds one
/// example from its first column), the targets the loss counts, and the positions that hold
/// tokens (not padding).
struct Batch {
  remat::Tensor<std::int32_t> ids, targets, starts;
  std::int64_t counted = 0, tokens = 0;
};

/// The examples of a data file as tokens, split for training and validation.
struct Data {
  std::vector<hub::TokenizedExample> train, val;
  std::optional<hub::ChatTemplate> chat;  ///< the template, for conversations (none for text)
  std::string report;                     ///< what the limits did and the token counts
  hub::TokenReport tokens;                ///< the same as figures (counts of every example)
  std::size_t longest = 0;                ///< tokens of the longest example kept
  std::int32_t pad = 0;                   ///< the id padding positions hold (never a target)
};

/// The chat template of the tokenizer's folder, or a ChatTemplateError saying it has none.
inline hub::ChatTemplate chat_template_of(const hub::Tokenizer& tok, const std::string& base) {
  const hub::TokenizerConfig& c = tok.config();
  if (!c.chat_template) {
    throw hub::ChatTemplateError(
        remat::detail::cat("finetune: ", base,
                           "/tokenizer_config.json has no chat_template (and there is no "
                           "chat_template.jinja beside it), so conversations cannot be rendered; "
                           "train on a .txt file instead"));
  }
  return hub::recognise_chat_template(*c.chat_template, c.bos_token.value_or(""),
                                      c.eos_token.value_or(""));
}

/// Sets the date `t` writes in its system block (what transformers' apply_chat_template does with
/// a `date_string` argument); only Meta's Llama 3.1+ templates write one.
inline void set_date(hub::ChatTemplate& t, const std::string& date, const std::string& base) {
  if (t.date_string.empty()) {
    throw remat::ArgumentError(remat::detail::cat(
        "finetune: --chat-date ", date, ": the chat template of ", base, " (",
        hub::family_name(t.family), ") writes no date; only Llama 3.1+ templates do"));
  }
  t.date_string = date;
}

/// Plain text documents as examples of at most `max_tokens` tokens: a longer document is cut
/// into consecutive windows that share one token, so that every next-token target is trained
/// on once. The report counts the documents cut as truncated.
inline hub::ChatData text_examples(const hub::Tokenizer& tok, const std::string& path,
                                   std::size_t max_tokens) {
  hub::ChatData out;
  std::vector<std::size_t> counts;
  for (const std::string& doc : hub::read_text_documents(path)) {
    const hub::TokenizedExample ex = hub::tokenize_document(tok, doc);
    ++out.report.examples;
    counts.push_back(ex.ids.size());
    if (ex.ids.size() > max_tokens) ++out.report.truncated;
    for (std::size_t begin = 0; begin + 1 < ex.ids.size(); begin += max_tokens - 1) {
      const std::size_t end = std::min(ex.ids.size(), begin + max_tokens);
      hub::TokenizedExample window;
      window.ids.assign(ex.ids.begin() + std::ptrdiff_t(begin),
                        ex.ids.begin() + std::ptrdiff_t(end));
      window.loss.assign(window.ids.size(), 1);
      out.report.tokens += window.ids.size();
      out.report.loss_tokens += window.ids.size() - 1;
      out.examples.push_back(std::move(window));
    }
  }
  hub::set_distribution(out.report, std::move(counts));
  if (out.examples.empty())
    throw hub::EmptyDataError(
        remat::detail::cat("finetune: ", path, " has no document of 2 tokens or more"));
  return out;
}

/// Reads `o.path` (.jsonl: conversations rendered with the folder's chat template; .txt: plain
/// text documents) with the tokenizer of `base`, limits it to `o.max_tokens` tokens an example
/// (`context`: the model's), and sets every tenth example aside for validation.
inline Data load(const hub::Tokenizer& tok, const std::string& base, const DataOptions& o,
                 std::size_t context) {
  if (o.max_tokens < 2 || o.max_tokens > context) {
    throw remat::ArgumentError(
        remat::detail::cat("finetune: --max-tokens ", o.max_tokens, " must be in [2, ", context,
                           "], the model's context (max_position_embeddings)"));
  }
  const std::string ext = std::filesystem::path(o.path).extension().string();
  if (ext != ".jsonl" && ext != ".txt") {
    throw remat::ArgumentError(remat::detail::cat(
        "finetune: --data ", o.path,
        ": with a Hugging Face folder the data is conversations (.jsonl) or plain text (.txt)"));
  }
  Data d;
  hub::ChatData examples;
  std::string skipped;
  if (ext == ".jsonl") {
    d.chat = chat_template_of(tok, base);
    if (!o.chat_date.empty()) set_date(*d.chat, o.chat_date, base);
    const hub::ConversationFile file = hub::read_conversations(o.path, {.skip_bad = o.skip_bad});
    if (file.skipped > 0)
      skipped = remat::detail::cat(
          "; ", file.skipped, " malformed lines skipped (the first: ", file.first_skipped, ")");
    examples = hub::prepare_chat_data(tok, *d.chat, file.conversations,
                                      {.max_tokens = o.max_tokens,
                                       .context = context,
                                       .truncate = o.truncate,
                                       .train_on = o.train_on,
                                       .skip_refused = o.skip_bad});
  } else {
    if (!o.conversation_flags.empty())
      throw remat::ArgumentError(remat::detail::cat("finetune: ", o.conversation_flags.front(),
                                                    " is for conversations (.jsonl); ", o.path,
                                                    " is plain text"));
    examples = text_examples(tok, o.path, o.max_tokens);
  }
  if (examples.examples.size() < 2) {
    throw hub::EmptyDataError(remat::detail::cat("finetune: ", o.path, " leaves ",
                                                 examples.examples.size(),
                                                 " example after its limits; training needs 2 "
                                                 "(one is kept for validation)"));
  }
  d.report = hub::describe(examples.report) + skipped;
  d.tokens = std::move(examples.report);
  for (std::size_t i = 0; i < examples.examples.size(); ++i) {
    d.longest = std::max(d.longest, examples.examples[i].ids.size());
    // every tenth example, or the last of fewer than ten
    const bool val =
        i % 10 == 9 || (examples.examples.size() < 10 && i + 1 == examples.examples.size());
    (val ? d.val : d.train).push_back(std::move(examples.examples[i]));
  }
  d.pad = tok.pad_id().value_or(tok.eos_id().value_or(0));
  return d;
}

/// `laid` as the model's inputs; `packed` keeps the starts.
inline Batch batch_of(const hub::TokenBatch& laid, bool packed) {
  hub::BatchInputs in = hub::batch_inputs(laid);
  Batch b;
  b.ids = std::move(in.ids);
  b.targets = std::move(in.targets);
  if (packed) b.starts = std::move(in.starts);
  b.counted = std::count_if(b.targets.data(), b.targets.data() + b.targets.numel(),
                            [](std::int32_t t) { return t != remat::kIgnoreTarget; });
  b.tokens = std::count_if(laid.segment.begin(), laid.segment.end(), [](int s) { return s >= 0; });
  return b;
}

/// The examples `which` of `pool`, one a row, padded to the longest of them.
inline Batch make_batch(const std::vector<hub::TokenizedExample>& pool,
                        std::span<const std::size_t> which, std::int32_t pad) {
  std::vector<hub::TokenizedExample> rows;
  std::size_t columns = 1;
  for (const std::size_t i : which) {
    rows.push_back(pool[i]);
    columns = std::max(columns, pool[i].ids.size() - 1);
  }
  return batch_of(hub::lay_out(rows, columns, hub::Layout::pad, pad), false);
}

/// Examples packed in order into `rows` rows of `columns` positions, taken from `next` until the
/// next one would need another row; that one is kept in `pending` for the following batch. The
/// rows are filled as lay_out fills them (hub::RowFill).
template <class Next>
Batch pack_batch(const std::vector<hub::TokenizedExample>& pool, std::size_t rows,
                 std::size_t columns, std::int32_t pad, std::optional<std::size_t>& pending,
                 Next&& next) {
  std::vector<hub::TokenizedExample> chosen;
  hub::RowFill fill(columns);
  for (;;) {
    const std::size_t i = pending ? *pending : next();
    pending.reset();
    const std::size_t n = pool[i].ids.size() - 1;
    if (fill.begins_row(n) && fill.rows == rows) {
      pending = i;
      break;
    }
    fill.place(n);
    chosen.push_back(pool[i]);
  }
  hub::TokenBatch laid = hub::lay_out(chosen, columns, hub::Layout::pack, pad);
  // a fixed shape: the rows the examples did not fill are padding
  laid.rows = rows;
  const std::size_t total = rows * columns;
  laid.ids.resize(total, pad);
  laid.targets.resize(total, -1);
  laid.loss.resize(total, 0);
  laid.positions.resize(total, 0);
  laid.segment.resize(total, -1);
  return batch_of(laid, true);
}

/// Rows [first, first + n) of `b`.
inline hub::TokenBatch rows_of(const hub::TokenBatch& b, std::size_t first, std::size_t n) {
  hub::TokenBatch out;
  out.rows = n;
  out.columns = b.columns;
  const auto cut = [&](const auto& v) {
    const auto begin = v.begin() + std::ptrdiff_t(first * b.columns);
    return std::decay_t<decltype(v)>(begin, begin + std::ptrdiff_t(n * b.columns));
  };
  out.ids = cut(b.ids);
  out.targets = cut(b.targets);
  out.loss = cut(b.loss);
  out.positions = cut(b.positions);
  out.segment = cut(b.segment);
  return out;
}

/// The first `examples` validation examples (all if fewer), in order, in batches of `rows` rows:
/// one example a row, padded, or packed into rows of `columns` positions when `columns` > 0. The
/// same examples either way, so that the validation loss does not depend on --pack.
inline std::vector<Batch> validation_batches(const Data& d, std::size_t examples, std::size_t rows,
                                             std::size_t columns) {
  const std::vector<hub::TokenizedExample> chosen(
      d.val.begin(), d.val.begin() + std::ptrdiff_t(std::min(examples, d.val.size())));
  std::vector<Batch> out;
  if (columns > 0) {
    const hub::TokenBatch laid = hub::lay_out(chosen, columns, hub::Layout::pack, d.pad);
    for (std::size_t r = 0; r < laid.rows; r += rows)
      out.push_back(batch_of(rows_of(laid, r, std::min(rows, laid.rows - r)), true));
    return out;
  }
  std::vector<std::size_t> all(chosen.size());
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = i;
  for (std::size_t at = 0; at < all.size(); at += rows)
    out.push_back(
        make_batch(chosen, std::span(all).subspan(at, std::min(rows, all.size() - at)), d.pad));
  return out;
}

/// The training examples in a new random order each epoch, `rows` at a time.
class Sampler {
 public:
  Sampler(std::size_t examples, std::uint64_t seed) : order_(examples), rng_(seed) {
    for (std::size_t i = 0; i < examples; ++i) order_[i] = i;
  }

  /// The next `rows` examples (at most all of them): an epoch ends mid-batch when it must, and
  /// the next one, in a new order, fills the batch, so that every batch has `rows` rows.
  std::vector<std::size_t> next(std::size_t rows) {
    std::vector<std::size_t> out;
    while (out.size() < std::min(rows, order_.size())) {
      if (at_ == order_.size()) at_ = 0;
      if (at_ == 0) shuffle();
      out.push_back(order_[at_++]);
    }
    return out;
  }
  /// Epochs begun so far, with the fraction of the current one done.
  double epochs() const { return double(epoch_ - 1) + double(at_) / double(order_.size()); }

 private:
  void shuffle() {
    ++epoch_;
    for (std::size_t i = order_.size(); i > 1; --i)  // Fisher-Yates
      std::swap(order_[i - 1], order_[static_cast<std::size_t>(rng_.uniform_int(std::int64_t(i)))]);
  }
  std::vector<std::size_t> order_;
  remat::Rng rng_;
  std::size_t at_ = 0, epoch_ = 0;  // the next place in order_, epochs begun
};

/// A prompt as the model sees it at the start of an answer: for conversations, a user turn with
/// `text` rendered by the chat template with its generation prompt, as transformers'
/// apply_chat_template(add_generation_prompt=True) tokenizes it; for text, `text` as
/// transformers' tokenizer encodes it (Tokenizer::encode_for_model).
inline std::vector<std::int32_t> prompt_ids(const hub::Tokenizer& tok, const Data& d,
                                            const std::string& text) {
  if (!d.chat) return tok.encode_for_model(text);
  const hub::Conversation c{.messages = {{hub::Role::user, text}}, .source = "--prompt"};
  return tok.encode(hub::render_generation_prompt(*d.chat, c), false);
}

}  // namespace chat
