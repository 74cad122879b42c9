#pragma once
/// @file
/// Choosing the next token from a row of logits: greedy (the first largest logit), or a draw
/// after Hugging Face's warpers in their order: temperature, then top-k, then top-p (nucleus).
///   - temperature t: logits / t;
///   - top-k: keeps the tokens whose logit is at least the k-th largest (ties at the k-th kept);
///   - top-p: keeps the most likely tokens whose probabilities, summed from the least likely up,
///     exceed 1 - p (so at least the most likely one), as transformers' TopPLogitsWarper.
/// The draw is a pure function of (seed, step): CounterRng keyed by both, so a generation is
/// reproduced by its seed whatever ran before it. Probabilities are computed in double.
/// top_k is 50 unless set, as in transformers' GenerationConfig (0 keeps every token). A
/// temperature so small that a logit / temperature overflows is an ArgumentError naming it (the
/// NaN it would give drew the last token).
///
/// apply_repetition_penalty() is transformers' RepetitionPenaltyLogitsProcessor, which generate()
/// runs on the logits before choosing (greedy or drawn), so before the warpers above.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "remat/core/error.hpp"
#include "remat/core/rng.hpp"

namespace remat::detail {

/// A double in [0, 1) with 53 random bits, the draw of `step` in the stream of `seed`.
inline double uniform_draw(std::uint64_t seed, std::uint64_t step) noexcept {
  const CounterRng rng = CounterRng::at(seed, step);
  const std::uint64_t hi = rng.bits(0) >> 5, lo = rng.bits(1) >> 6;  // 27 + 26 bits
  return static_cast<double>((hi << 26) | lo) * 0x1p-53;
}

}  // namespace remat::detail

namespace remat::nn {

/// How the next token is chosen. temperature 0 is greedy; top_k and top_p then play no part.
struct SamplingOptions {
  double temperature = 0.0;  ///< 0: greedy; > 0: draw from softmax(logits / temperature)
  std::int64_t top_k = 50;   ///< keep the k most likely tokens (0: all); 50 is HF's default
  double top_p = 1.0;        ///< keep the most likely tokens holding this much probability (1: all)
  std::uint64_t seed = 0;    ///< the draws' stream

  bool greedy() const noexcept { return temperature == 0.0; }

  void validate() const {
    if (!(std::isfinite(temperature) && temperature >= 0) || top_k < 0 ||
        !(top_p > 0 && top_p <= 1)) {
      throw ArgumentError(detail::cat(
          "nn::SamplingOptions: need temperature >= 0 and finite, top_k >= 0 and top_p in (0, "
          "1]; got temperature ",
          temperature, ", top_k ", top_k, ", top_p ", top_p));
    }
  }
};

/// The index of the first largest of n logits (torch.argmax's choice among ties).
template <class T>
std::int32_t argmax(const T* logits, std::int64_t n) {
  if (n < 1) throw ArgumentError("nn::argmax: no logits");
  return static_cast<std::int32_t>(std::max_element(logits, logits + n) - logits);
}

/// The probabilities the draw of sample_token() uses: softmax of the warped logits, zero for the
/// tokens top-k and top-p removed. Needs a sampling (non-greedy) configuration.
template <class T>
std::vector<double> sampling_probabilities(const T* logits, std::int64_t n,
                                           const SamplingOptions& o) {
  o.validate();
  if (n < 1) throw ArgumentError("nn::sampling_probabilities: no logits");
  if (o.greedy())
    throw ArgumentError("nn::sampling_probabilities: temperature 0 is greedy; nothing is drawn");
  std::vector<double> scores(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    scores[i] = static_cast<double>(logits[i]) / o.temperature;
    // +inf or NaN would make every probability NaN (exp(inf - inf)); -inf is probability 0
    if (std::isnan(scores[i]) || scores[i] == HUGE_VAL) {
      throw ArgumentError(detail::cat("nn::sampling_probabilities: temperature ", o.temperature,
                                      " is too small: logit ", i, " (", logits[i], ") / ",
                                      o.temperature, " is ", scores[i], ", not a finite number"));
    }
  }
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));  // most likely first
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::int64_t a, std::int64_t b) { return scores[a] > scores[b]; });
  std::vector<bool> kept(static_cast<std::size_t>(n), true);
  if (o.top_k > 0 && o.top_k < n) {
    const double kth = scores[order[o.top_k - 1]];
    for (std::int64_t i = 0; i < n; ++i) kept[i] = scores[i] >= kth;
  }
  const double top = scores[order[0]];
  std::vector<double> p(static_cast<std::size_t>(n), 0.0);
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (kept[i]) sum += p[i] = std::exp(scores[i] - top);
  }
  for (double& v : p) v /= sum;
  if (o.top_p < 1) {
    // From the least likely kept token up: drop while the sum so far stays <= 1 - top_p; the
    // most likely token is never dropped.
    double below = 0;
    for (std::int64_t r = n - 1; r >= 1; --r) {
      const std::int64_t i = order[r];
      if (!kept[i]) continue;
      below += p[i];
      if (below > 1 - o.top_p) break;
      kept[i] = false;
    }
    sum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      if (!kept[i]) p[i] = 0;
      sum += p[i];
    }
    for (double& v : p) v /= sum;
  }
  return p;
}

/// transformers' RepetitionPenaltyLogitsProcessor: each token among `ids` (the prompt and the
/// tokens generated so far; a repeated id counts once) has its logit divided by `penalty`, or
/// multiplied when negative, in the logits' own type as transformers does in float32. 1 changes
/// nothing; > 1 makes repeating less likely.
template <class T>
void apply_repetition_penalty(T* logits, std::int64_t n, const std::vector<std::int32_t>& ids,
                              double penalty) {
  if (!(std::isfinite(penalty) && penalty > 0)) {
    throw ArgumentError(detail::cat(
        "nn::apply_repetition_penalty: the penalty must be finite and > 0, got ", penalty));
  }
  if (penalty == 1.0) return;
  const T p = static_cast<T>(penalty);
  std::vector<bool> done(static_cast<std::size_t>(n), false);
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= n) {
      throw IndexError(detail::cat("nn::apply_repetition_penalty: id ", id, " is not one of the ",
                                   n, " logits"));
    }
    if (done[static_cast<std::size_t>(id)]) continue;
    done[static_cast<std::size_t>(id)] = true;
    logits[id] = logits[id] < 0 ? logits[id] * p : logits[id] / p;
  }
}

/// The token chosen from n logits at generation step `step`: greedy, or drawn (see the file
/// comment) from the stream of o.seed at `step`.
template <class T>
std::int32_t sample_token(const T* logits, std::int64_t n, const SamplingOptions& o,
                          std::uint64_t step) {
  o.validate();
  if (o.greedy()) return argmax(logits, n);
  const std::vector<double> p = sampling_probabilities(logits, n, o);
  const double u = detail::uniform_draw(o.seed, step);
  double acc = 0;
  std::int32_t last = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (p[i] == 0) continue;
    last = static_cast<std::int32_t>(i);
    acc += p[i];
    if (u < acc) return last;
  }
  return last;  // u above the rounded total: the last token that can be drawn
}

}  // namespace remat::nn
