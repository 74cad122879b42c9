// A minimal program a user of remat would write; built by the find_package and FetchContent
// consumer projects.
#include <remat/remat.hpp>

#include <cstdio>

int main() {
  remat::Parameter<float> w(remat::Tensor<float>::from({1, 2}, {0.5f, -1.0f}));
  remat::Tape tape;
  auto x = tape.input(remat::Tensor<float>::from({1, 2}, {2.0f, 3.0f}));
  auto loss = remat::sum(remat::mul(x, w));
  tape.backward(loss);
  std::printf("loss %.2f grad %.1f %.1f\n", loss.item(), w.grad()[0], w.grad()[1]);
  return loss.item() == -2.0f && w.grad()[0] == 2.0f && w.grad()[1] == 3.0f ? 0 : 1;
}
