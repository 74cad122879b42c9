#pragma once
/// @file
/// The BPE model of tokenizer.json: a vocabulary, ranked merges (either all `"a b"` strings or
/// all `["a", "b"]` pairs), an optional unknown token (`fuse_unk`), byte fallback to `<0xXX>`
/// tokens (SentencePiece-style models: Llama 2, Mistral), `ignore_merges` (a word already in the
/// vocabulary is one token: Llama 3), `continuing_subword_prefix` and `end_of_word_suffix`.
///
/// A word is split into its characters, then the adjacent pair of lowest merge rank is merged
/// (leftmost first on ties) until no pair has a rank: symbols in a linked list, candidate pairs
/// in a min-heap, stale candidates skipped when popped, as Hugging Face's `Word::merge_all`
/// does. Results are cached per word and thread. `dropout` other than null/0 is refused: ids
/// would be random.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "remat/hub/json_file.hpp"
#include "remat/hub/utf8.hpp"

namespace remat::hub {

namespace detail {

/// Hash of strings usable with string_view keys (heterogeneous lookup).
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

/// Open-addressing table from a pair of token ids to (rank, merged id): the BPE inner loop
/// looks pairs up far more often than anything else.
class MergeTable {
 public:
  struct Entry {
    std::uint64_t key = kEmpty;
    std::uint32_t rank = 0;
    std::uint32_t merged = 0;
  };
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  void reserve(std::size_t count) {
    std::size_t capacity = 16;
    while (capacity < count * 2) capacity *= 2;
    entries_.assign(capacity, Entry{});
    mask_ = capacity - 1;
  }
  /// Inserts or overwrites (a later duplicate merge wins, as in Hugging Face's map).
  void put(std::uint32_t a, std::uint32_t b, std::uint32_t rank, std::uint32_t merged) {
    const std::uint64_t key = pack(a, b);
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      if (entries_[i].key == kEmpty || entries_[i].key == key) {
        entries_[i] = Entry{key, rank, merged};
        return;
      }
    }
  }
  /// The entry for (a, b), or nullptr.
  const Entry* find(std::uint32_t a, std::uint32_t b) const {
    const std::uint64_t key = pack(a, b);
    for (std::size_t i = slot(key);; i = (i + 1) & mask_) {
      if (entries_[i].key == key) return &entries_[i];
      if (entries_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static std::uint64_t pack(std::uint32_t a, std::uint32_t b) {
    return (std::uint64_t{a} << 32) | b;
  }
  std::size_t slot(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }
  std::vector<Entry> entries_;
  std::size_t mask_ = 0;
};

}  // namespace detail

/// A BPE model read from tokenizer.json's `model` object.
class Bpe {
 public:
  /// Reads the `model` field (its `type` must be "BPE").
  explicit Bpe(const JsonField& model) {
    model.require_keys({"type", "dropout", "unk_token", "continuing_subword_prefix",
                        "end_of_word_suffix", "fuse_unk", "byte_fallback", "ignore_merges", "vocab",
                        "merges"});
    const std::string type = model["type"].string();
    if (type != "BPE")
      model["type"].fail(
          remat::detail::cat("model type '", type, "' is not supported (supported: BPE)"));
    if (model.has("dropout") && !model["dropout"].is_null()) {
      const auto& d = model["dropout"].value();
      if (!d.is_number() || d.get<double>() != 0.0)
        model["dropout"].fail(remat::detail::cat("BPE dropout ", model["dropout"].shown(),
                                                 " is not supported (ids would be random)"));
    }
    if (model.has("unk_token") && !model["unk_token"].is_null())
      unk_token_ = model["unk_token"].string();
    if (model.has("continuing_subword_prefix") && !model["continuing_subword_prefix"].is_null())
      prefix_ = model["continuing_subword_prefix"].string();
    if (model.has("end_of_word_suffix") && !model["end_of_word_suffix"].is_null())
      suffix_ = model["end_of_word_suffix"].string();
    fuse_unk_ = model.boolean_or("fuse_unk", false);
    byte_fallback_ = model.boolean_or("byte_fallback", false);
    ignore_merges_ = model.boolean_or("ignore_merges", false);
    read_vocab(model["vocab"]);
    read_merges(model["merges"]);
    for (int b = 0; b < 256; ++b) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
      byte_ids_[b] = static_cast<std::int32_t>(token_to_id(name));
    }
    if (unk_token_ && token_to_id(*unk_token_) < 0)
      model["unk_token"].fail(
          remat::detail::cat("unk_token '", *unk_token_, "' is not in the vocabulary"));
    static std::atomic<std::uint64_t> serial{0};
    serial_ = ++serial;
  }

  /// Number of entries of the vocabulary.
  std::size_t vocab_size() const { return vocab_.size(); }
  /// One past the largest id of the vocabulary.
  std::size_t id_limit() const { return id_to_token_.size(); }
  /// The id of `token`, or -1.
  std::int64_t token_to_id(std::string_view token) const {
    const auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }
  /// The token of `id`, or nullptr.
  const std::string* id_to_token(std::int64_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= id_to_token_.size() || !has_id_[id])
      return nullptr;
    return &id_to_token_[static_cast<std::size_t>(id)];
  }

  /// Appends the ids of `word` (one pre-tokenized piece, valid UTF-8) to `ids`.
  void tokenize(std::string_view word, std::vector<std::int32_t>& ids) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (const auto it = vocab_.find(word); it != vocab_.end()) {
        ids.push_back(it->second);
        return;
      }
    }
    auto& cache = thread_cache();
    if (const auto it = cache.find(word); it != cache.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
    const std::size_t first = ids.size();
    merge_word(word, ids);
    // words longer than this are rarely repeated; Hugging Face's cache has the same bound
    if (word.size() < 256) {
      if (cache.size() >= kCacheCapacity) cache.clear();
      cache.emplace(std::string(word), std::vector<std::int32_t>(ids.begin() + first, ids.end()));
    }
  }

 private:
  static constexpr std::size_t kCacheCapacity = 1 << 17;
  using Cache = std::unordered_map<std::string, std::vector<std::int32_t>, detail::StringHash,
                                   std::equal_to<>>;

  /// This model's word cache on the calling thread (a thread never shares it, so no lock).
  Cache& thread_cache() const {
    thread_local std::unordered_map<std::uint64_t, Cache> caches;
    thread_local std::uint64_t last_serial = 0;
    thread_local Cache* last = nullptr;
    if (last_serial != serial_ || last == nullptr) {
      // a thread that used many tokenizers keeps only a few caches
      if (caches.size() > 8) caches.clear();
      last = &caches[serial_];
      last_serial = serial_;
    }
    return *last;
  }

  void read_vocab(const JsonField& vocab) {
    if (!vocab.value().is_object()) vocab.fail("expected an object of token: id");
    vocab_.reserve(vocab.value().size());
    std::int64_t max_id = -1;
    for (const auto& item : vocab.value().items()) {
      // the field's path (for a message) is built only on failure: 100,000s of entries
      const auto& v = item.value();
      if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
          v.get<std::int64_t>() > INT32_MAX) {
        const JsonField id(v, vocab.child(item.key()));
        id.fail(remat::detail::cat("expected an id (an integer from 0 to 2^31 - 1), found ",
                                   id.shown()));
      }
      const std::int64_t id = v.get<std::int64_t>();
      vocab_.emplace(item.key(), static_cast<std::int32_t>(id));
      max_id = std::max(max_id, id);
    }
    // ids are dense in every real file; a sparse one would waste memory here
    if (max_id >= static_cast<std::int64_t>(4 * vocab_.size() + 1024))
      vocab.fail(remat::detail::cat("largest id ", max_id, " for ", vocab_.size(),
                                    " tokens: a sparse vocabulary is not supported"));
    id_to_token_.assign(static_cast<std::size_t>(max_id + 1), std::string());
    has_id_.assign(static_cast<std::size_t>(max_id + 1), false);
    for (const auto& [token, id] : vocab_) {
      if (has_id_[id])
        vocab.fail(remat::detail::cat("id ", id, " is given to both '", id_to_token_[id], "' and '",
                                      token, "'"));
      id_to_token_[id] = token;
      has_id_[id] = true;
    }
  }

  void read_merges(const JsonField& merges) {
    const std::size_t n = merges.size();
    merges_.reserve(n);
    const std::size_t prefix_size = prefix_ ? prefix_->size() : 0;
    std::string a, b;
    for (std::size_t rank = 0; rank < n; ++rank) {
      // the field's path (for a message) is built only on failure: 100,000s of merges
      const nlohmann::json& raw = merges.value()[rank];
      const auto fail = [&](const std::string& why) { merges.at(rank).fail(why); };
      if (raw.is_string()) {
        // "a b": exactly one space (Hugging Face refuses anything else)
        const std::string& line = raw.get_ref<const std::string&>();
        const std::size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
          fail(remat::detail::cat("merge '", line, "' is not two tokens separated by one space"));
        a.assign(line, 0, space);
        b.assign(line, space + 1);
      } else if (raw.is_array() && raw.size() == 2 && raw[0].is_string() && raw[1].is_string()) {
        a = raw[0].get_ref<const std::string&>();
        b = raw[1].get_ref<const std::string&>();
      } else {
        fail(remat::detail::cat("expected \"a b\" or [\"a\", \"b\"], found ",
                                merges.at(rank).shown()));
      }
      // tokenizers reads the whole list as "a b" strings or as pairs, never a mix of the two
      if (raw.is_array() != merges.value()[0].is_array())
        fail(remat::detail::cat("merge ", merges.at(rank).shown(), " is ",
                                raw.is_array() ? "a pair" : "a string", " but merges[0] is ",
                                raw.is_array() ? "a string" : "a pair",
                                ": the list must be all \"a b\" strings or all [\"a\", \"b\"] "
                                "pairs"));
      const std::int64_t ia = token_to_id(a), ib = token_to_id(b);
      if (ia < 0) fail(remat::detail::cat("merge token '", a, "' is not in the vocabulary"));
      if (ib < 0) fail(remat::detail::cat("merge token '", b, "' is not in the vocabulary"));
      if (b.size() < prefix_size)
        fail(remat::detail::cat("merge token '", b, "' is shorter than the subword prefix"));
      const std::string merged = a + b.substr(prefix_size);
      const std::int64_t im = token_to_id(merged);
      if (im < 0) fail(remat::detail::cat("merged token '", merged, "' is not in the vocabulary"));
      merges_.put(static_cast<std::uint32_t>(ia), static_cast<std::uint32_t>(ib),
                  static_cast<std::uint32_t>(rank), static_cast<std::uint32_t>(im));
    }
  }

  struct Symbol {
    std::int32_t id;
    std::int32_t prev, next;  // -1 at the ends
    bool alive;
  };

  /// Splits `word` into its characters' ids (byte fallback or unknown token where a character
  /// is not in the vocabulary).
  void initial_symbols(std::string_view word, std::vector<Symbol>& symbols) const {
    std::int32_t pending_unk = -1;  // an unknown token not yet emitted (fuse_unk), or -1
    const auto push = [&](std::int32_t id) {
      symbols.push_back(Symbol{id, static_cast<std::int32_t>(symbols.size()) - 1, -1, true});
    };
    std::string decorated;
    for (std::size_t at = 0; at < word.size();) {
      const std::size_t n = utf8::char_length(word, at);
      std::string_view c = word.substr(at, n);
      const bool first = at == 0, last = at + n == word.size();
      if ((!first && prefix_) || (last && suffix_)) {
        decorated.assign(!first && prefix_ ? *prefix_ : std::string());
        decorated.append(c);
        if (last && suffix_) decorated.append(*suffix_);
        c = decorated;
      }
      at += n;
      if (const auto it = vocab_.find(c); it != vocab_.end()) {
        if (pending_unk >= 0) push(pending_unk);
        pending_unk = -1;
        push(it->second);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (const char b : c) all = all && byte_ids_[static_cast<unsigned char>(b)] >= 0;
        if (all) {
          for (const char b : c) push(byte_ids_[static_cast<unsigned char>(b)]);
          continue;
        }
      }
      if (unk_token_) {
        const auto unk = static_cast<std::int32_t>(token_to_id(*unk_token_));
        if (pending_unk >= 0 && !fuse_unk_) push(pending_unk);
        pending_unk = unk;
      }
    }
    if (pending_unk >= 0) push(pending_unk);
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i)
      symbols[i].next = static_cast<std::int32_t>(i + 1);
  }

  void merge_word(std::string_view word, std::vector<std::int32_t>& ids) const {
    thread_local std::vector<Symbol> symbols;
    // candidates as rank << 32 | position: one integer comparison orders them by rank, then
    // leftmost first, and a min-heap of them pops what Hugging Face's heap pops
    thread_local std::vector<std::uint64_t> heap;
    symbols.clear();
    heap.clear();
    initial_symbols(word, symbols);
    const auto later = std::greater<std::uint64_t>();
    const auto push_pair = [&](std::int32_t pos) {
      const std::int32_t next = symbols[pos].next;
      if (next < 0) return;
      if (const auto* e = merges_.find(static_cast<std::uint32_t>(symbols[pos].id),
                                       static_cast<std::uint32_t>(symbols[next].id))) {
        heap.push_back((std::uint64_t{e->rank} << 32) | static_cast<std::uint32_t>(pos));
        std::push_heap(heap.begin(), heap.end(), later);
      }
    };
    for (std::size_t i = 0; i + 1 < symbols.size(); ++i) push_pair(static_cast<std::int32_t>(i));
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), later);
      const std::uint64_t top = heap.back();
      heap.pop_back();
      const auto rank = static_cast<std::uint32_t>(top >> 32);
      const auto pos = static_cast<std::int32_t>(top & 0xFFFFFFFFu);
      Symbol& left = symbols[pos];
      if (!left.alive || left.next < 0) continue;
      const Symbol& right = symbols[left.next];
      // stale: the pair at this position changed since the candidate was pushed (a rank
      // belongs to one pair, so an equal rank means the same merge)
      const auto* e =
          merges_.find(static_cast<std::uint32_t>(left.id), static_cast<std::uint32_t>(right.id));
      if (e == nullptr || e->rank != rank) continue;
      const std::int32_t right_pos = left.next;
      left.id = static_cast<std::int32_t>(e->merged);
      left.next = right.next;
      symbols[right_pos].alive = false;
      if (left.next >= 0) symbols[left.next].prev = pos;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(pos);
    }
    for (const Symbol& sym : symbols)
      if (sym.alive) ids.push_back(sym.id);
  }

  std::unordered_map<std::string, std::int32_t, detail::StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  detail::MergeTable merges_;
  std::optional<std::string> unk_token_, prefix_, suffix_;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  std::int32_t byte_ids_[256];
  std::uint64_t serial_ = 0;
};

}  // namespace remat::hub
