#pragma once
/// @file
/// plan::profile: measures a Chain (the input of every planner) by running one forward and one
/// backward pass of a sequence of layers on a tape of its own.

#include <chrono>
#include <iterator>
#include <vector>

#include "remat/checkpoint/plan.hpp"
#include "remat/core/memory.hpp"
#include "remat/core/tape.hpp"

namespace remat::plan {
namespace detail {

/// Identity op that reads the allocator when the backward sweep passes it: live bytes, and the
/// peak since the previous marker, which it then resets.
template <class T>
class MemoryMarker final : public Node<T> {
 public:
  MemoryMarker(double* live, double* peak) : live_(live), peak_(peak) {}
  const char* op_name() const noexcept override { return "profile_marker"; }
  Tensor<T> forward(typename Node<T>::Inputs in) override { return in[0]; }
  void backward(const Tensor<T>& gy, remat::Grads<T>& grads) override {
    *peak_ = static_cast<double>(memory::peak_bytes());
    *live_ = static_cast<double>(memory::live_bytes());
    memory::reset_peak();
    grads.add(0, gy);
  }

 private:
  double* live_;
  double* peak_;
};

}  // namespace detail

struct ProfileOptions {
  /// Forward passes timed; each layer's cost is the median (memory is measured once).
  int repeats = 3;
};

/// Measures each layer's boundary, kept activation and transient bytes, whether it keeps its
/// output, and its forward time, by running `layers` on `input` and then `loss` on the result
/// (one forward, one backward), on a tape of its own. Parameters used by the layers receive
/// gradients: call zero_grad() afterwards. Profile after one training step: the first backward
/// pass also allocates the parameters' gradient buffers, which later steps reuse, and would
/// count them as transients.
template <class Layers, class T, class Loss>
Chain profile(Layers&& layers, const Tensor<T>& input, Loss&& loss, ProfileOptions options = {}) {
  const auto n = static_cast<std::size_t>(std::distance(std::begin(layers), std::end(layers)));
  if (n == 0) throw PlanError("plan::profile: no layers to profile");
  if (options.repeats < 1) throw PlanError(remat::detail::cat("plan::profile: repeats must be >= 1, got ", options.repeats));
  Chain c;
  c.boundary_bytes.assign(n + 1, 0);
  c.activation_bytes.assign(n, 0);
  c.forward_transient_bytes.assign(n, 0);
  c.backward_transient_bytes.assign(n, 0);
  c.saves_output.assign(n, true);
  std::vector<std::vector<double>> times(n);
  std::vector<double> live(n + 1, 0), peak(n + 1, 0);
  for (int run = 0; run < options.repeats; ++run) {
    const bool measure_memory = run == options.repeats - 1;
    Tape tape;
    Var<T> x = tape.input(input);
    std::size_t l = 0;
    for (auto&& layer : layers) {
      if (measure_memory) x = apply<T>(std::make_unique<detail::MemoryMarker<T>>(&live[l], &peak[l]), {x});
      const Var<T> held = x;  // keeps x_l alive while layer l is measured
      const double before = static_cast<double>(memory::live_bytes());
      memory::reset_peak();
      const auto t0 = std::chrono::steady_clock::now();
      x = layer(x);
      times[l].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      const double after = static_cast<double>(memory::live_bytes());
      c.boundary_bytes[l] = static_cast<double>(held.value().bytes());
      c.activation_bytes[l] = std::max(0.0, after - before - static_cast<double>(x.value().bytes()));
      c.forward_transient_bytes[l] = std::max(0.0, static_cast<double>(memory::peak_bytes()) - after);
      c.saves_output[l] = !x.value().is_unique();  // someone besides x holds it: the layer saved it
      ++l;
    }
    c.boundary_bytes[n] = static_cast<double>(x.value().bytes());
    if (!measure_memory) continue;
    x = apply<T>(std::make_unique<detail::MemoryMarker<T>>(&live[n], &peak[n]), {x});
    const double before_loss = static_cast<double>(memory::live_bytes());
    memory::reset_peak();
    const Var<T> value = loss(x);
    const double after_loss = static_cast<double>(memory::live_bytes());
    // what the loss keeps; then its value and the gradient of ones backward() seeds it with
    c.loss_output_bytes = 2.0 * static_cast<double>(value.value().bytes());
    c.loss_bytes = after_loss - before_loss - c.loss_output_bytes / 2;
    c.loss_forward_transient_bytes = std::max(0.0, static_cast<double>(memory::peak_bytes()) - after_loss);
    const Tensor<T> seed = Tensor<T>::ones(value.shape());
    const double before_backward = static_cast<double>(memory::live_bytes());
    memory::reset_peak();
    tape.backward(value, seed);
    c.loss_backward_transient_bytes = std::max(0.0, peak[n] - before_backward);
    // The marker before layer 0 sits on the input, which needs no gradient, so it never runs:
    // layer 0's backward peak is the peak since the marker before layer 1.
    peak[0] = static_cast<double>(memory::peak_bytes());
    for (std::size_t i = 0; i < n; ++i) c.backward_transient_bytes[i] = std::max(0.0, peak[i] - live[i + 1]);
  }
  c.forward_cost.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::sort(times[i].begin(), times[i].end());
    c.forward_cost[i] = times[i][times[i].size() / 2];
  }
  return c;
}

/// profile() with no loss: the backward pass starts from a gradient of ones on the output.
template <class Layers, class T>
Chain profile(Layers&& layers, const Tensor<T>& input, ProfileOptions options = {}) {
  Chain c = profile(std::forward<Layers>(layers), input, [](const Var<T>& y) { return y; }, options);
  // the "loss" was the output itself, its seed x_n's gradient
  c.loss_bytes = c.loss_output_bytes = c.loss_forward_transient_bytes = c.loss_backward_transient_bytes = 0;
  return c;
}

}  // namespace remat::plan
