#include "support/gradcheck.hpp"
#include <remat/nn/quantize_blocks.hpp>

namespace {

using remat::Tensor;
using remat::Var;
using remat::WeightStorage;

}  // namespace

TEST_CASE("Linear::quantize freezes the weight: no parameter, no gradient, counted bytes",
          "[nn][quantized][memory]") {
  for (WeightStorage s : {WeightStorage::bf16, WeightStorage::int8, WeightStorage::nf4}) {
    remat::Rng rng(4);
    remat::nn::Linear<float> layer(512, 256, rng);
    const Tensor<float> x = rng.normal_tensor<float>({8, 512});
    const std::size_t before = remat::memory::live_bytes();
    layer.quantize(s);
    const double counted_weight = double(remat::memory::live_bytes()) - double(before) +
                                  512.0 * 256 * 4;  // the float weight was freed
    INFO(remat::to_string(s) << ": " << counted_weight / (512.0 * 256) << " bytes a parameter");
    CHECK(counted_weight == double(layer.quantized_weight()->bytes()));
    if (s == WeightStorage::nf4) CHECK(counted_weight / (512.0 * 256) <= 0.57);
    CHECK(layer.storage() == s);
    CHECK(layer.in_features() == 512);
    CHECK(layer.out_features() == 256);
    const auto names = layer.named_parameters();
    REQUIRE(names.size() == 1);
    CHECK(names[0].first == "bias");
    CHECK_THROWS_AS(layer.quantize(WeightStorage::nf4), remat::UsageError);

    remat::Tape tape;
    Var<float> in = tape.input(x, true);
    const Var<float> y = layer(in);
    const Tensor<float> want =
        remat::linear(Var<float>(x), Var<float>(layer.quantized_weight()->dequantize()),
                      Var<float>(layer.bias.value()))
            .value();
    for (std::int64_t i = 0; i < want.numel(); ++i)
      CHECK(y.value()[i] == Approx(want[i]).margin(1e-4));
    tape.backward(remat::sum(y));
    CHECK(layer.bias.grad().defined());
    CHECK(in.grad().defined());
  }
}

TEST_CASE("Linear::quantize(f32) only freezes; a double Linear quantizes too", "[nn][quantized]") {
  remat::Rng rng(6);
  remat::nn::Linear<double> layer(70, 3, rng, false);
  const Tensor<double> w = layer.weight.value().clone();
  layer.quantize(WeightStorage::f32);
  CHECK(layer.weight.frozen());
  CHECK(layer.named_parameters().size() == 1);
  remat::nn::Linear<double> q(70, 3, rng, false);
  q.quantize(WeightStorage::nf4);
  CHECK(q.named_parameters().empty());
  remat::test::gradcheck([&](const auto& v) { return q(v[0]); }, {remat::test::randn({4, 70}, 2)});
}

TEST_CASE("quantize_blocks gives the freed float weights back to the system, not the cache",
          "[nn][quantized][memory]") {
  if (remat::detail::BlockCache::kDefaultLimit == 0) return;  // sanitized: nothing is cached
  remat::nn::Llama<float> model({.vocab_size = 64,
                                 .hidden_size = 64,
                                 .intermediate_size = 128,
                                 .num_hidden_layers = 2,
                                 .num_attention_heads = 4,
                                 .num_key_value_heads = 2});
  remat::memory::release_cache();
  { const Tensor<float> freed({1024}); }  // a freed buffer is cached, as in a training loop
  REQUIRE(remat::memory::cached_bytes() > 0);
  remat::nn::quantize_blocks(model, WeightStorage::nf4);
  CHECK(remat::memory::cached_bytes() == 0);
}

TEST_CASE("Linear::quantize called alone gives its freed float weight back to the system",
          "[nn][quantized][memory]") {
  if (remat::detail::BlockCache::kDefaultLimit == 0) return;  // sanitized: nothing is cached
  remat::Rng rng(3);
  remat::nn::Linear<float> big(1024, 512, rng, false);  // 2 MiB: pages of its own when freed
  remat::memory::release_cache();
  const std::size_t live = remat::memory::live_bytes();
  big.quantize(WeightStorage::int8);
  CHECK(remat::memory::live_bytes() < live);  // the float matrix was freed...
  CHECK(remat::memory::cached_bytes() == 0);  // ...and not kept for reuse
}
