#pragma once
/// @file
/// tokenizer.json post-processors: what `encode` adds around the ids of one text when special
/// tokens are asked for (Hugging Face's default). Supported: `TemplateProcessing` (its `single`
/// template: Llama 2's and Llama 3.1's BOS), `ByteLevel` (offsets only: ids unchanged) and
/// `Sequence`; any other type is an IoError naming it. Pairs of texts are not encoded here, but
/// the `pair` template is still checked.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "remat/hub/json_file.hpp"

namespace remat::hub {

/// Adds special tokens around the ids of one encoded text.
class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  /// Rewrites `ids` (a single sequence, special tokens asked for).
  virtual void process(std::vector<std::int32_t>& ids) const = 0;
};

namespace detail {

class SequenceProcessor final : public PostProcessor {
 public:
  explicit SequenceProcessor(std::vector<std::unique_ptr<PostProcessor>> steps)
      : steps_(std::move(steps)) {}
  void process(std::vector<std::int32_t>& ids) const override {
    for (const auto& step : steps_) step->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

class IdentityProcessor final : public PostProcessor {
 public:
  void process(std::vector<std::int32_t>&) const override {}
};

/// One template item: a run of special-token ids, or the sequence itself (empty ids).
struct TemplateItem {
  bool sequence = false;
  std::vector<std::int32_t> ids;
};

class TemplateProcessor final : public PostProcessor {
 public:
  explicit TemplateProcessor(std::vector<TemplateItem> single) : single_(std::move(single)) {}
  void process(std::vector<std::int32_t>& ids) const override {
    std::vector<std::int32_t> out;
    out.reserve(ids.size() + 8);
    for (const TemplateItem& item : single_) {
      if (item.sequence)
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
    ids = std::move(out);
  }

 private:
  std::vector<TemplateItem> single_;
};

/// A template (`single` or `pair`) resolved against `special_tokens`.
inline std::vector<TemplateItem> read_template(
    const JsonField& list, const std::map<std::string, std::vector<std::int32_t>>& special,
    bool pair) {
  std::vector<TemplateItem> items;
  for (std::size_t i = 0; i < list.size(); ++i) {
    const JsonField item = list.at(i);
    item.require_keys({"SpecialToken", "Sequence"});
    if (item.has("SpecialToken")) {
      const JsonField s = item["SpecialToken"];
      s.require_keys({"id", "type_id"});
      const std::string name = s["id"].string();
      s["type_id"].integer();
      const auto it = special.find(name);
      if (it == special.end())
        s["id"].fail(remat::detail::cat("special token '", name, "' is not in special_tokens"));
      items.push_back(TemplateItem{false, it->second});
    } else if (item.has("Sequence")) {
      const JsonField s = item["Sequence"];
      s.require_keys({"id", "type_id"});
      const std::string name = s["id"].string();
      s["type_id"].integer();
      if (name != "A" && !(pair && name == "B"))
        s["id"].fail(remat::detail::cat("sequence '", name, "' is not ", pair ? "A or B" : "A"));
      items.push_back(TemplateItem{true, {}});
    } else {
      item.fail("expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
    }
  }
  return items;
}

}  // namespace detail

/// The post-processor a tokenizer.json `post_processor` field describes (nullptr for null).
inline std::unique_ptr<PostProcessor> make_post_processor(const JsonField& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j["type"].string();
  if (type == "Sequence") {
    j.require_keys({"type", "processors"});
    std::vector<std::unique_ptr<PostProcessor>> steps;
    const JsonField list = j["processors"];
    for (std::size_t i = 0; i < list.size(); ++i) {
      // tokenizers reads each member as a post-processor: null is none of them
      if (list.at(i).is_null()) list.at(i).fail("expected a post-processor, found null");
      steps.push_back(make_post_processor(list.at(i)));
    }
    return std::make_unique<detail::SequenceProcessor>(std::move(steps));
  }
  if (type == "ByteLevel") {
    j.require_keys({"type", "add_prefix_space", "trim_offsets", "use_regex"});
    return std::make_unique<detail::IdentityProcessor>();
  }
  if (type == "TemplateProcessing") {
    j.require_keys({"type", "single", "pair", "special_tokens"});
    std::map<std::string, std::vector<std::int32_t>> special;
    const JsonField tokens = j["special_tokens"];
    if (!tokens.value().is_object()) tokens.fail("expected an object");
    for (const auto& entry : tokens.value().items()) {
      const JsonField s(entry.value(), tokens.child(entry.key()));
      s.require_keys({"id", "ids", "tokens"});
      const JsonField ids = s["ids"];
      std::vector<std::int32_t> values;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::int64_t id = ids.at(i).integer();
        if (id < 0 || id > INT32_MAX)
          ids.at(i).fail(remat::detail::cat("id ", id, " is out of range"));
        values.push_back(static_cast<std::int32_t>(id));
      }
      if (s["tokens"].size() != values.size()) s["tokens"].fail("expected as many tokens as ids");
      special[entry.key()] = std::move(values);
    }
    auto single = detail::read_template(j["single"], special, false);
    detail::read_template(j["pair"], special, true);
    return std::make_unique<detail::TemplateProcessor>(std::move(single));
  }
  j["type"].fail(remat::detail::cat("post-processor type '", type,
                                    "' is not supported (supported: TemplateProcessing, ByteLevel, "
                                    "Sequence)"));
}

}  // namespace remat::hub
