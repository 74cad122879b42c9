// With odr_b.cpp: both include every header and instantiate the same templates.
#include <remat/remat.hpp>

float odr_loss_b();

float odr_loss_a() {
  remat::Tape tape;
  auto x = tape.input(remat::Tensor<float>::full({2, 3}, 0.5f), true);
  auto loss = remat::mean(remat::tanh(x));
  tape.backward(loss);
  return loss.item();
}

int main() { return odr_loss_a() == odr_loss_b() && remat::memory::live_bytes() == 0 ? 0 : 1; }
