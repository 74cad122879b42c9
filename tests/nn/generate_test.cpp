// Generation with a KV cache (nn/generate.hpp, nn/kv_cache.hpp) against the model's own full
// forward (the tape forward, no cache), on generated Llama configs (grouped-query attention,
// tied and untied heads, q/k/v biases, LoRA adapters, BF16/INT8/NF4 storage) and GPTs:
//   - a prefill of the prompt gives the full forward's logits bit for bit (same calls, same
//     order: Note [cached attention order]);
//   - each later step's logits are within kStepBound of the full forward's on the whole
//     sequence, and greedy generation picks the full forward's argmax at every step;
//   - the cache allocates exactly 2 x layers x capacity x kv_width x sizeof(T) bytes, nothing
//     else outlives a step, no tape records, a step's peak does not grow with the prompt beyond
//     the attention row over the cache;
//   - the sampling warpers keep the tokens their definitions name, draws follow the
//     probabilities and are reproduced by their seed; eos and stop strings end a generation
//     (stop strings by StopStringCriteria's rule, the prompt's text included); the repetition
//     penalty is transformers' and greedy follows the penalized argmax; top_k defaults to 50; a
//     temperature that overflows the scores and a max_new_tokens that overflows are refused.
#include <catch2/catch.hpp>

#include <remat/core/memory.hpp>
#include <remat/core/tape.hpp>
#include <remat/nn/generate.hpp>
#include <remat/nn/lora.hpp>
#include <remat/nn/quantize_blocks.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

// Named, not anonymous: the suite compiles test files five to a unit (unity build), where the
// helpers' short names could meet another file's.
namespace remat_generate_test {

using remat::Tensor;
using remat::WeightStorage;
using remat::nn::GenerateOptions;

/// Note [step bound]: a decode step computes every value of the full forward with the same
/// formula, but its GEMMs have 1 row where the full forward's have prompt + step rows, and BLAS
/// may block (and so sum) a dot product differently by row count. Each value then differs by
/// reordered sums of at most max(C, I, T) <= 64 terms, each within a few units of rounding
/// (u = 2^-53 in double) of terms of size <= 1; through <= 3 layers that stays far below 64 x 64
/// x 2^-53 ~ 5e-13 per logit of size ~1. The bound below is that, relative to the largest logit.
constexpr double kStepBound = 1e-12;

struct Case {
  remat::nn::LlamaConfig config;
  bool lora = false;
  WeightStorage storage = WeightStorage::f32;
  std::string name() const {
    std::ostringstream s;
    s << "layers " << config.num_hidden_layers << " heads " << config.num_attention_heads << "/"
      << config.num_key_value_heads << " hidden " << config.hidden_size << " vocab "
      << config.vocab_size << (config.tie_word_embeddings ? " tied" : " untied")
      << (config.attention_bias ? " bias" : "") << (config.o_proj_bias ? " o_bias" : "")
      << (config.mlp_bias ? " mlp_bias" : "") << (config.qk_norm ? " qk_norm" : "") << " head_dim "
      << config.head_dim() << " rope " << remat::to_string(config.rope_scaling.type) << " window "
      << config.sliding_window << (config.sliding_layers.empty() ? "" : " on some layers")
      << (lora ? " lora" : "") << " " << remat::to_string(storage);
    return s.str();
  }
};

/// Random small Llama configs covering every option generation must honour.
Case random_case(std::uint64_t seed) {
  std::mt19937_64 g(seed);
  const auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(g);
  };
  Case c;
  remat::nn::LlamaConfig& m = c.config;
  m.num_key_value_heads = pick(1, 2);
  m.num_attention_heads = m.num_key_value_heads * pick(1, 3);
  m.hidden_size = m.num_attention_heads * 2 * pick(1, 4);
  m.intermediate_size = pick(8, 40);
  m.num_hidden_layers = pick(1, 3);
  m.vocab_size = pick(16, 64);
  m.max_position_embeddings = 64;
  m.tie_word_embeddings = pick(0, 1);
  m.attention_bias = pick(0, 1);
  m.rope_theta = pick(0, 1) ? 10000.0 : 500.0;
  // the families' options (nn/llama.hpp): each drawn on its own
  if (pick(0, 2) == 0) m.explicit_head_dim = 2 * pick(1, 5);  // Qwen3: need not be hidden / heads
  m.qk_norm = pick(0, 2) == 0;
  m.o_proj_bias = pick(0, 2) == 0;
  m.mlp_bias = pick(0, 2) == 0;
  switch (pick(0, 4)) {  // none (twice as likely), linear, dynamic, llama3
    case 1:
      m.rope_scaling = {.type = remat::RopeScalingType::linear, .factor = 2.5};
      break;
    case 2:
      m.rope_scaling = {.type = remat::RopeScalingType::dynamic, .factor = 2.0};
      break;
    case 3:
      m.rope_scaling = {.type = remat::RopeScalingType::llama3,
                        .factor = 8.0,
                        .low_freq_factor = 1.0,
                        .high_freq_factor = 4.0,
                        .original_max_position_embeddings = 8};
      break;
    default:
      break;
  }
  if (pick(0, 2) == 0) {  // Mistral's window, shorter than the sequences; on some layers (Qwen2)
    m.sliding_window = pick(1, 5);
    if (pick(0, 1)) {
      for (std::int64_t l = 0; l < m.num_hidden_layers; ++l) m.sliding_layers.push_back(pick(0, 1));
    }
  }
  m.initializer_range = 0.3;  // large weights: logits spread, no near-ties in the argmax
  m.seed = seed + 1;
  c.lora = pick(0, 1);
  const WeightStorage storages[] = {WeightStorage::f32, WeightStorage::bf16, WeightStorage::int8,
                                    WeightStorage::nf4};
  c.storage = storages[pick(0, 3)];
  return c;
}

/// The model of a case: quantized, then wrapped with adapters whose B is random (zero would
/// leave the base model), in evaluation mode.
struct Built {
  std::unique_ptr<remat::nn::Llama<double>> model;
  std::optional<remat::nn::lora::Adapters<double>> adapters;
};

Built build(const Case& c) {
  Built b;
  b.model = std::make_unique<remat::nn::Llama<double>>(c.config);
  if (c.storage != WeightStorage::f32) remat::nn::quantize_blocks(*b.model, c.storage);
  if (c.lora) {
    b.adapters.emplace(remat::nn::lora::apply(
        *b.model,
        {.rank = 2, .alpha = 4, .targets = {"q_proj", "v_proj", "down_proj"}, .seed = 3}));
    remat::Rng rng(c.config.seed + 7);
    for (const auto& a : b.adapters->adapters())
      remat::Parameter<double>(a.B.weight).data() =
          rng.normal_tensor<double>(a.B.weight.shape(), 0, 0.3);
  }
  b.model->eval();
  return b;
}

/// The full forward's logits (no cache) for a sequence, all positions (T, V).
template <class Model>
Tensor<double> full_logits(const Model& model, const std::vector<std::int32_t>& seq) {
  const remat::NoGradGuard no_grad;
  Tensor<std::int32_t> ids(remat::Shape{1, static_cast<std::int64_t>(seq.size())});
  std::copy(seq.begin(), seq.end(), ids.data());
  const Tensor<double> l = model.logits(ids).value();
  return l.reshape(remat::Shape{l.dim(1), l.dim(2)});
}

std::vector<std::int32_t> random_ids(std::uint64_t seed, std::int64_t n, std::int64_t vocab) {
  std::mt19937_64 g(seed);
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  for (auto& id : out)
    id = static_cast<std::int32_t>(std::uniform_int_distribution<std::int64_t>(0, vocab - 1)(g));
  return out;
}

double max_abs(const double* a, std::int64_t n) {
  double m = 0;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(a[i]));
  return m;
}

/// Prefill bitwise, then `steps` greedy steps each within the bound of the full forward and
/// choosing its argmax; returns the largest relative step difference seen.
template <class Model>
double check_against_full(const Model& model, std::vector<std::int32_t> seq, std::int64_t steps) {
  const std::int64_t prompt = static_cast<std::int64_t>(seq.size());
  remat::nn::KvCache<double> cache = remat::nn::make_kv_cache(model, 1, prompt + steps);
  Tensor<std::int32_t> ids(remat::Shape{1, prompt});
  std::copy(seq.begin(), seq.end(), ids.data());
  const Tensor<double> prefill = remat::nn::forward_cached(model, ids, cache, true);
  const Tensor<double> full = full_logits(model, seq);
  REQUIRE(prefill.numel() == full.numel());
  CHECK(std::equal(prefill.begin(), prefill.end(), full.begin()));  // bit for bit
  const std::int64_t vocab = full.dim(1);
  std::int32_t next = remat::nn::argmax(full.data() + (prompt - 1) * vocab, vocab);
  double worst = 0;
  for (std::int64_t s = 0; s < steps; ++s) {
    seq.push_back(next);
    Tensor<std::int32_t> one(remat::Shape{1, 1});
    one[0] = next;
    const Tensor<double> step = remat::nn::forward_cached(model, one, cache);
    const Tensor<double> reference = full_logits(model, seq);
    const double* ref = reference.data() + (reference.dim(0) - 1) * vocab;
    double diff = 0;
    for (std::int64_t v = 0; v < vocab; ++v) diff = std::max(diff, std::abs(step[v] - ref[v]));
    const double rel = diff / std::max(1.0, max_abs(ref, vocab));
    worst = std::max(worst, rel);
    CHECK(rel <= kStepBound);
    next = remat::nn::argmax(step.data(), vocab);
    CHECK(next == remat::nn::argmax(ref, vocab));
  }
  CHECK(cache.length() == prompt + steps);
  return worst;
}

TEST_CASE(
    "Cached Llama logits equal the full forward's: the prefill bitwise, each step within "
    "1e-12",
    "[nn][generate]") {
  double worst = 0;
  for (std::uint64_t seed = 0; seed < 24; ++seed) {
    const Case c = random_case(seed);
    INFO("case " << seed << ": " << c.name());
    const Built b = build(c);
    const std::vector<std::int32_t> prompt =
        random_ids(seed + 100, 1 + static_cast<std::int64_t>(seed % 9), c.config.vocab_size);
    worst = std::max(worst, check_against_full(*b.model, prompt, 6));
  }
  WARN("largest step difference relative to the largest logit: " << worst);
}

TEST_CASE("A batch of sequences in one cache: each row is its own sequence's forward",
          "[nn][generate]") {
  for (std::uint64_t seed = 50; seed < 56; ++seed) {
    const Case c = random_case(seed);
    INFO("case " << seed << ": " << c.name());
    const Built b = build(c);
    const std::int64_t batch = 3, prompt = 4, steps = 3, vocab = c.config.vocab_size;
    remat::nn::KvCache<double> cache = remat::nn::make_kv_cache(*b.model, batch, prompt + steps);
    std::vector<std::vector<std::int32_t>> seqs;
    Tensor<std::int32_t> ids(remat::Shape{batch, prompt});
    for (std::int64_t r = 0; r < batch; ++r) {
      seqs.push_back(random_ids(seed * 10 + std::uint64_t(r), prompt, vocab));
      std::copy(seqs[r].begin(), seqs[r].end(), ids.data() + r * prompt);
    }
    Tensor<double> logits = remat::nn::forward_cached(*b.model, ids, cache, true);
    {
      const remat::NoGradGuard no_grad;
      const Tensor<double> full = b.model->logits(ids).value();
      CHECK(std::equal(logits.begin(), logits.end(), full.begin()));  // the prefill: bit for bit
    }
    for (std::int64_t s = 0; s < steps; ++s) {
      Tensor<std::int32_t> next(remat::Shape{batch, 1});
      for (std::int64_t r = 0; r < batch; ++r) {
        const double* row =
            logits.data() +
            (logits.rank() == 3 ? (r * logits.dim(1) + logits.dim(1) - 1) * vocab : r * vocab);
        next[r] = remat::nn::argmax(row, vocab);
        seqs[r].push_back(next[r]);
      }
      logits = remat::nn::forward_cached(*b.model, next, cache);
      REQUIRE(logits.shape() == remat::Shape{batch, vocab});
      for (std::int64_t r = 0; r < batch; ++r) {
        const Tensor<double> full = full_logits(*b.model, seqs[r]);
        const double* ref = full.data() + (full.dim(0) - 1) * vocab;
        double diff = 0;
        for (std::int64_t v = 0; v < vocab; ++v)
          diff = std::max(diff, std::abs(logits[r * vocab + v] - ref[v]));
        CHECK(diff / std::max(1.0, max_abs(ref, vocab)) <= kStepBound);
      }
    }
  }
}

TEST_CASE("Greedy generation picks the full forward's argmax at every step", "[nn][generate]") {
  for (std::uint64_t seed = 30; seed < 42; ++seed) {
    const Case c = random_case(seed);
    INFO("case " << seed << ": " << c.name());
    const Built b = build(c);
    const std::vector<std::int32_t> prompt = random_ids(seed, 5, c.config.vocab_size);
    const remat::nn::Generated g =
        remat::nn::generate(*b.model, prompt, GenerateOptions{.max_new_tokens = 8});
    REQUIRE(g.ids.size() == 8);
    CHECK(g.reason == remat::nn::StopReason::max_new_tokens);
    std::vector<std::int32_t> seq = prompt;
    for (const std::int32_t id : g.ids) {
      const Tensor<double> full = full_logits(*b.model, seq);
      const std::int64_t vocab = full.dim(1);
      CHECK(id == remat::nn::argmax(full.data() + (full.dim(0) - 1) * vocab, vocab));
      seq.push_back(id);
    }
  }
}

TEST_CASE("Cached GPT logits equal the full forward's; greedy follows its argmax",
          "[nn][generate][gpt]") {
  for (std::uint64_t seed = 0; seed < 8; ++seed) {
    std::mt19937_64 g(seed);
    const auto pick = [&](std::int64_t lo, std::int64_t hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(g);
    };
    remat::nn::GPTConfig config{.vocab = pick(16, 48),
                                .context = 24,
                                .layers = pick(1, 3),
                                .heads = pick(1, 3),
                                .width = 0,
                                .dropout = 0.1,
                                .tied = pick(0, 1) == 1,
                                .seed = seed + 5};
    config.width = config.heads * pick(1, 5);  // odd head sizes too: no RoPE here
    INFO("case " << seed << ": layers " << config.layers << " heads " << config.heads << " width "
                 << config.width << (config.tied ? " tied" : ""));
    remat::nn::GPT<double> model(config);
    model.eval();  // dropout 0.1 configured: evaluation turns it off, as generation needs
    check_against_full(model, random_ids(seed, 1 + pick(0, 8), config.vocab), 8);
  }
}

TEST_CASE(
    "Generation records no tape; the cache's bytes are the predicted ones; a step's peak "
    "grows only by the attention row",
    "[nn][generate][memory]") {
  const Case c = random_case(5);
  const Built b = build(c);
  const remat::nn::LlamaConfig& m = c.config;
  const std::int64_t capacity = 40;
  const std::int64_t head_dim = m.head_dim();
  const std::size_t predicted = 2 * std::size_t(m.num_hidden_layers) * capacity *
                                std::size_t(m.num_key_value_heads * head_dim) * sizeof(double);
  const std::size_t before = remat::memory::live_bytes();
  {
    remat::nn::KvCache<double> cache = remat::nn::make_kv_cache(*b.model, 1, capacity);
    CHECK(remat::memory::live_bytes() - before == predicted);
    CHECK(cache.bytes() == predicted);
    // prefill, then steps; after each, only the cache (and the returned logits) is alive
    Tensor<std::int32_t> ids(remat::Shape{1, 4});
    for (int i = 0; i < 4; ++i) ids[i] = i;
    std::map<std::int64_t, std::size_t> peaks;  // cache length -> a step's peak above its start
    for (std::int64_t len = 4; len < capacity; ++len) {
      std::size_t peak = 0;
      {
        const remat::memory::Probe probe;
        const Tensor<double> logits = remat::nn::forward_cached(*b.model, ids, cache);
        peak = probe.peak_above_start();
        CHECK(remat::memory::live_bytes() - probe.start() ==
              sizeof(double) * std::size_t(m.vocab_size));
        ids = Tensor<std::int32_t>(remat::Shape{1, 1});
        ids[0] = remat::nn::argmax(logits.data(), m.vocab_size);
      }
      if (len > 4) peaks[cache.length() - 1] = peak;  // steps: one new position over len - 1
    }
    // A step at cache length L holds one (1 x (L + 1)) score row; nothing else depends on L.
    for (auto [len, peak] : peaks) {
      INFO("cache length " << len);
      CHECK(peak <=
            peaks.begin()->second + sizeof(double) * std::size_t(len - peaks.begin()->first));
    }
  }
  CHECK(remat::memory::live_bytes() == before);  // the cache freed, nothing else retained

  // Under a recording tape, generation adds no node and leaves nothing alive afterwards.
  remat::Tape tape;
  const std::size_t nodes = tape.size();
  const std::size_t live = remat::memory::live_bytes();
  const remat::nn::Generated g =
      remat::nn::generate(*b.model, {1, 2, 3}, GenerateOptions{.max_new_tokens = 5});
  CHECK(g.ids.size() == 5);
  CHECK(g.cache_bytes == remat::nn::KvCache<double>::bytes_for(m.num_hidden_layers, 1, 8,
                                                               m.num_key_value_heads * head_dim));
  CHECK(tape.size() == nodes);
  CHECK(remat::memory::live_bytes() == live);
}

TEST_CASE("Greedy takes the first largest logit; warpers keep what their definitions name",
          "[nn][generate][sampling]") {
  const double tied[] = {0.5, 2.0, -1.0, 2.0};
  CHECK(remat::nn::argmax(tied, 4) == 1);
  CHECK(remat::nn::sample_token(tied, 4, {}, 0) == 1);

  std::mt19937_64 g(11);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t n = std::uniform_int_distribution<std::int64_t>(2, 30)(g);
    std::vector<double> logits(static_cast<std::size_t>(n));
    for (double& l : logits) l = std::normal_distribution<double>(0, 2)(g);
    remat::nn::SamplingOptions o;
    o.temperature = std::uniform_real_distribution<double>(0.2, 2.0)(g);
    o.top_k = std::uniform_int_distribution<std::int64_t>(0, n)(g);
    o.top_p = trial % 3 == 0 ? 1.0 : std::uniform_real_distribution<double>(0.05, 1.0)(g);
    INFO("n " << n << " temperature " << o.temperature << " top_k " << o.top_k << " top_p "
              << o.top_p);
    const std::vector<double> p = remat::nn::sampling_probabilities(logits.data(), n, o);
    // independent reading of the definitions: rank by logit, keep the k first, then the fewest
    // first ones whose softmax mass (over the k) reaches top_p
    std::vector<std::int64_t> rank(static_cast<std::size_t>(n));
    std::iota(rank.begin(), rank.end(), 0);
    std::sort(rank.begin(), rank.end(), [&](auto a, auto b) { return logits[a] > logits[b]; });
    const std::int64_t k = o.top_k == 0 ? n : o.top_k;
    double z = 0;
    for (std::int64_t r = 0; r < k; ++r)
      z += std::exp((logits[rank[r]] - logits[rank[0]]) / o.temperature);
    std::int64_t m = o.top_p == 1 ? k : 0;
    for (double mass = 0; m < k && !(m > 0 && mass >= o.top_p); ++m)
      mass += std::exp((logits[rank[m]] - logits[rank[0]]) / o.temperature) / z;
    double total = 0;
    for (std::int64_t r = 0; r < n; ++r) {
      const double pr = p[rank[r]];
      total += pr;
      if (r < m) {
        CHECK(pr > 0);
        // within the kept set, proportional to exp(logit / temperature)
        CHECK(pr / p[rank[0]] ==
              Approx(std::exp((logits[rank[r]] - logits[rank[0]]) / o.temperature)).epsilon(1e-12));
      } else {
        CHECK(pr == 0);
      }
    }
    CHECK(total == Approx(1.0).epsilon(1e-12));
  }
}

TEST_CASE("Draws follow the probabilities and are reproduced by their seed",
          "[nn][generate][sampling]") {
  const double logits[] = {1.0, 0.0, 2.0, -1.0, 0.5};
  const remat::nn::SamplingOptions o{.temperature = 0.8, .top_k = 4, .top_p = 0.95, .seed = 42};
  const std::vector<double> p = remat::nn::sampling_probabilities(logits, 5, o);
  CHECK(p[3] == 0);  // top-k 4 drops the least likely
  const int draws = 40000;
  std::vector<int> count(5, 0);
  for (int s = 0; s < draws; ++s) ++count[remat::nn::sample_token(logits, 5, o, std::uint64_t(s))];
  for (int i = 0; i < 5; ++i) {
    INFO("token " << i << " p " << p[i] << " count " << count[i]);
    const double sigma = std::sqrt(draws * p[i] * (1 - p[i]));
    CHECK(std::abs(count[i] - draws * p[i]) <= 5 * sigma);  // fails by chance < 1e-6
  }
  // a pure function of (seed, step): the same draws again, others with another seed
  int same = 0, moved = 0;
  remat::nn::SamplingOptions other = o;
  other.seed = 43;
  for (int s = 0; s < 200; ++s) {
    same += remat::nn::sample_token(logits, 5, o, std::uint64_t(s)) ==
            remat::nn::sample_token(logits, 5, o, std::uint64_t(s));
    moved += remat::nn::sample_token(logits, 5, o, std::uint64_t(s)) !=
             remat::nn::sample_token(logits, 5, other, std::uint64_t(s));
  }
  CHECK(same == 200);
  CHECK(moved > 50);

  // a sampled generation is reproduced by its seed
  const Built b = build(random_case(3));
  GenerateOptions go{.max_new_tokens = 12, .sampling = {.temperature = 1.5, .seed = 9}};
  const auto first = remat::nn::generate(*b.model, {1, 2}, go).ids;
  CHECK(remat::nn::generate(*b.model, {1, 2}, go).ids == first);
  go.sampling.seed = 10;
  CHECK(remat::nn::generate(*b.model, {1, 2}, go).ids != first);  // 12 draws over >= 16 tokens
}

TEST_CASE("Generation stops at an end-of-sequence id and at a stop string", "[nn][generate]") {
  const Case c = random_case(8);
  const Built b = build(c);
  const std::vector<std::int32_t> prompt = {3, 1, 4};
  const auto free_run = remat::nn::generate(*b.model, prompt, {.max_new_tokens = 10}).ids;
  REQUIRE(free_run.size() == 10);
  for (std::size_t stop_at = 0; stop_at < free_run.size(); ++stop_at) {
    INFO("eos = the token at step " << stop_at);
    const std::int32_t eos = free_run[stop_at];
    const auto first = std::find(free_run.begin(), free_run.end(), eos) - free_run.begin();
    const auto g = remat::nn::generate(*b.model, prompt, {.max_new_tokens = 10, .eos_ids = {eos}});
    CHECK(g.reason == remat::nn::StopReason::eos);
    CHECK(g.ids == std::vector<std::int32_t>(free_run.begin(), free_run.begin() + first + 1));
  }
  // text: one letter per id; the stop string is the text of steps 4 and 5
  const auto decode = [](const std::vector<std::int32_t>& ids) {
    std::string s;
    for (const std::int32_t id : ids) s += char('a' + id % 26);
    return s;
  };
  const std::string text = decode(free_run);
  const std::string stop = text.substr(4, 2);
  const std::size_t end = text.find(stop) + stop.size();
  std::vector<std::int32_t> streamed;
  const auto g =
      remat::nn::generate(*b.model, prompt,
                          {.max_new_tokens = 10,
                           .stop = {"\x01never", stop},
                           .decode = decode,
                           .on_token = [&](std::int32_t id) { streamed.push_back(id); }});
  CHECK(g.reason == remat::nn::StopReason::stop_string);
  CHECK(g.ids ==
        std::vector<std::int32_t>(free_run.begin(), free_run.begin() + std::ptrdiff_t(end)));
  CHECK(streamed == g.ids);
}

TEST_CASE("Generation refuses bad input with a clear error", "[nn][generate]") {
  const Built b = build(random_case(1));
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(remat::nn::generate(*b.model, {}, {}), Contains("prompt is empty"));
  CHECK_THROWS_WITH(remat::nn::generate(*b.model, {1}, {.max_new_tokens = 0}),
                    Contains("max_new_tokens must be >= 1, got 0"));
  CHECK_THROWS_WITH(remat::nn::generate(*b.model, {1}, {.max_new_tokens = 64}),
                    Contains("capacity 65 exceeds the model's max_position_embeddings = 64"));
  CHECK_THROWS_WITH(remat::nn::generate(*b.model, {1}, {.stop = {"x"}}),
                    Contains("stop strings need a decode function"));
  CHECK_THROWS_WITH(
      remat::nn::generate(*b.model, {1}, {.sampling = {.temperature = 1, .top_p = 0}}),
      Contains("top_p 0"));
  CHECK_THROWS_WITH(remat::nn::generate(*b.model, {1}, {.sampling = {.temperature = -1}}),
                    Contains("temperature -1"));
  b.model->train();
  CHECK_THROWS_WITH(remat::nn::generate(*b.model, {1}, {}), Contains("call eval() first"));
  b.model->eval();
  remat::nn::KvCache<double> cache = remat::nn::make_kv_cache(*b.model, 1, 3);
  Tensor<std::int32_t> four(remat::Shape{1, 4});
  four.fill(0);
  CHECK_THROWS_WITH(remat::nn::forward_cached(*b.model, four, cache),
                    Contains("4 new positions do not fit the KV cache (0 of 3 positions used)"));
  CHECK(cache.length() == 0);
}

TEST_CASE(
    "A stop string counts where it ends inside the last token's text, the prompt's text "
    "included (transformers' StopStringCriteria)",
    "[nn][generate]") {
  const Built b = build(random_case(8));
  const std::vector<std::int32_t> prompt = {3, 1, 4};
  const auto free_run = remat::nn::generate(*b.model, prompt, {.max_new_tokens = 10}).ids;
  // text: one letter per id; decode sees the whole sequence, prompt first
  const auto decode = [](const std::vector<std::int32_t>& ids) {
    std::string s;
    for (const std::int32_t id : ids) s += char('a' + id % 26);
    return s;
  };
  const std::string prompt_text = decode(prompt);
  const std::string first = decode({free_run[0]});
  const auto stops_after = [&](const std::string& stop) {
    const auto g = remat::nn::generate(*b.model, prompt,
                                       {.max_new_tokens = 10, .stop = {stop}, .decode = decode});
    return g.reason == remat::nn::StopReason::stop_string ? g.ids.size() : std::size_t{0};
  };
  // begun in the prompt, ended by the first new token: one token, as transformers stops
  CHECK(stops_after(prompt_text.substr(1) + first) == 1);
  // wholly in the prompt: never a stop (it does not end inside a new token)
  CHECK(stops_after(prompt_text) == 0);
  CHECK(stops_after(prompt_text.substr(0, 2)) == 0);
  // decode is given the prompt and the new ids
  std::vector<std::size_t> lengths;
  remat::nn::generate(*b.model, prompt,
                      {.max_new_tokens = 3,
                       .stop = {"\x01never"},
                       .decode = [&](const std::vector<std::int32_t>& ids) {
                         lengths.push_back(ids.size());
                         return decode(ids);
                       }});
  CHECK(lengths == std::vector<std::size_t>{3, 4, 5, 6});
  // the rule itself: the text before the last token is "abcd", the last token's "ef"
  CHECK(remat::detail::ends_after("abcdef", 4, {"de"}));        // begins before, ends inside
  CHECK(remat::detail::ends_after("abcdef", 4, {"f"}));         // wholly inside
  CHECK_FALSE(remat::detail::ends_after("abcdef", 4, {"cd"}));  // ends where it begins
  CHECK_FALSE(remat::detail::ends_after("abcdef", 4, {"x", "bc"}));
  CHECK(remat::detail::ends_after("abcdef", 4, {"x", "abcdef"}));
}

TEST_CASE(
    "The repetition penalty is transformers' RepetitionPenaltyLogitsProcessor, before the "
    "choice",
    "[nn][generate][sampling]") {
  // each seen id once: positive logits divided, negative ones multiplied, in the logits' type
  std::vector<float> logits = {2.0f, -1.5f, 0.75f, -0.25f, 3.0f};
  remat::nn::apply_repetition_penalty(logits.data(), 5, {0, 1, 1, 3, 0}, 1.3);
  CHECK(logits == std::vector<float>{2.0f / 1.3f, -1.5f * 1.3f, 0.75f, -0.25f * 1.3f, 3.0f});
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(remat::nn::apply_repetition_penalty(logits.data(), 5, {5}, 1.3),
                    Contains("id 5 is not one of the 5 logits"));
  CHECK_THROWS_WITH(remat::nn::apply_repetition_penalty(logits.data(), 5, {1}, 0.0),
                    Contains("finite and > 0, got 0"));

  // greedy generation with a penalty picks the penalized full forward's argmax at every step,
  // and a strong one keeps it from repeating a token
  for (std::uint64_t seed = 60; seed < 66; ++seed) {
    const Case c = random_case(seed);
    INFO("case " << seed << ": " << c.name());
    const Built b = build(c);
    const std::vector<std::int32_t> prompt = random_ids(seed, 4, c.config.vocab_size);
    const double penalty = 1e6;
    const auto g =
        remat::nn::generate(*b.model, prompt, {.max_new_tokens = 8, .repetition_penalty = penalty});
    std::vector<std::int32_t> seq = prompt;
    for (const std::int32_t id : g.ids) {
      const Tensor<double> full = full_logits(*b.model, seq);
      const std::int64_t vocab = full.dim(1);
      std::vector<double> last(full.data() + (full.dim(0) - 1) * vocab,
                               full.data() + full.dim(0) * vocab);
      remat::nn::apply_repetition_penalty(last.data(), vocab, seq, penalty);
      CHECK(id == remat::nn::argmax(last.data(), vocab));
      seq.push_back(id);
    }
    // without the penalty greedy repeats a token of the prompt or its own (tiny vocabularies,
    // random weights); with it the continuation differs
    const auto plain = remat::nn::generate(*b.model, prompt, {.max_new_tokens = 8}).ids;
    std::vector<std::int32_t> all = prompt;
    all.insert(all.end(), plain.begin(), plain.end());
    std::sort(all.begin(), all.end());
    if (std::adjacent_find(all.begin(), all.end()) != all.end()) CHECK(g.ids != plain);
  }
}

TEST_CASE("Sampling defaults to transformers' top_k 50 and refuses a temperature that overflows",
          "[nn][generate][sampling]") {
  CHECK(remat::nn::SamplingOptions{}.top_k == 50);
  std::vector<double> logits(80);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[i] = 0.01 * double(i);
  const std::vector<double> p =
      remat::nn::sampling_probabilities(logits.data(), 80, {.temperature = 1.0});
  CHECK(std::count_if(p.begin(), p.end(), [](double v) { return v > 0; }) == 50);
  CHECK(p[29] == 0);
  CHECK(p[30] > 0);
  // 1e-310 divides a logit of ~1 to infinity: every probability would be NaN and the draw would
  // fall to the last token
  const double one[] = {0.5, 1.0, -0.5};
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(remat::nn::sample_token(one, 3, {.temperature = 1e-310}, 0),
                    Contains("temperature 1e-310 is too small"));
  // small but finite scores are fine, and pick the largest
  CHECK(remat::nn::sample_token(one, 3, {.temperature = 1e-300}, 0) == 1);
}

TEST_CASE("max_new_tokens that overflows with the prompt's length is refused", "[nn][generate]") {
  const Built b = build(random_case(1));
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(
      remat::nn::generate(*b.model, {1, 2},
                          {.max_new_tokens = std::numeric_limits<std::int64_t>::max()}),
      Contains("max_new_tokens 9223372036854775807 and the prompt's 2 tokens add up to more"));
  CHECK_THROWS_WITH(remat::nn::generate(*b.model, {1}, {.repetition_penalty = -1}),
                    Contains("repetition_penalty must be finite and > 0, got -1"));
}

}  // namespace remat_generate_test
