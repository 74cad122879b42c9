#pragma once
/// @file
/// Learning-rate schedule: linear warm-up, then cosine decay to a floor.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "remat/core/error.hpp"

namespace remat::optim {

/// lr(step) rises linearly from peak/warmup to peak over `warmup` steps, then follows a half
/// cosine from peak down to min_lr at step `total`, and stays there.
class CosineSchedule {
 public:
  CosineSchedule(double peak, std::int64_t warmup, std::int64_t total, double min_lr = 0)
      : peak_(peak), min_(min_lr), warmup_(warmup), total_(total) {
    if (!(peak > 0) || !(min_lr >= 0) || min_lr > peak || warmup < 0 || total < 1 ||
        warmup > total) {
      throw ArgumentError(
          detail::cat("CosineSchedule: need 0 <= min_lr <= peak, peak > 0 and 0 <= warmup <= "
                      "total, total >= 1; got peak ",
                      peak, ", min_lr ", min_lr, ", warmup ", warmup, ", total ", total));
    }
  }

  /// The learning rate for step `step` (counting from 0).
  double operator()(std::int64_t step) const noexcept {
    if (step < warmup_) return peak_ * double(step + 1) / double(warmup_);
    const double span = std::max<double>(1.0, double(total_ - warmup_));
    const double progress = std::min(1.0, double(step - warmup_) / span);
    return min_ + 0.5 * (peak_ - min_) * (1 + std::cos(std::numbers::pi * progress));
  }

 private:
  double peak_, min_;
  std::int64_t warmup_, total_;
};

}  // namespace remat::optim
