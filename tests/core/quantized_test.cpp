#include "support/gradcheck.hpp"
#include "support/reference.hpp"

#include <cstring>

namespace {

using remat::QuantizedWeight;
using remat::Tensor;
using remat::WeightStorage;

// The NormalFloat4 table as published (QLoRA, Appendix E; bitsandbytes' functional.py).
const float kPublishedNf4[16] = {-1.0f,
                                 -0.6961928009986877f,
                                 -0.5250730514526367f,
                                 -0.39491748809814453f,
                                 -0.28444138169288635f,
                                 -0.18477343022823334f,
                                 -0.09105003625154495f,
                                 0.0f,
                                 0.07958029955625534f,
                                 0.16093020141124725f,
                                 0.24611230194568634f,
                                 0.33791524171829224f,
                                 0.44070982933044434f,
                                 0.5626170039176941f,
                                 0.7229568362236023f,
                                 1.0f};

Tensor<float> quantized_case_tensor(const nlohmann::json& c, const char* key) {
  return remat::test::json_tensor<float>(c.at(key));
}

/// The bits of each float (so that -0.0 and 0.0 differ, as bit for bit means).
std::vector<std::uint32_t> quantized_bits(const Tensor<float>& t) {
  std::vector<std::uint32_t> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.data(), out.size() * 4);
  return out;
}

/// make_quantized_reference.py's generated(): an integer hash as a fraction of 2^32, times a
/// scale, in double, rounded to float (the same operations there, so the same floats).
std::vector<float> generated_values(std::int64_t n, std::uint64_t salt, double scale) {
  std::vector<float> out(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < out.size(); ++i) {
    const std::uint64_t h = (i * 2654435761u + salt) % (std::uint64_t{1} << 32);
    out[i] = static_cast<float>(double(h) / 4294967296.0 * scale);
  }
  return out;
}

/// The mean of floats summed in double and rounded once (what remat took before torch's order).
float correctly_rounded_mean(const std::vector<float>& x) {
  double sum = 0;
  for (const float v : x) sum += v;
  return static_cast<float>(sum / double(x.size()));
}

}  // namespace

TEST_CASE("NF4 codes are the published NormalFloat4 values and round-trip exactly",
          "[core][quantized]") {
  for (int i = 0; i < 16; ++i) CHECK(remat::kNf4Codes[std::size_t(i)] == kPublishedNf4[i]);
  // A block holding every code times 2.5 (absmax 2.5): each value comes back as itself.
  remat::Rng rng(3);
  for (int trial = 0; trial < 10; ++trial) {
    const float scale = float(rng.uniform(0.1, 10.0));
    Tensor<float> w({4, 16});
    for (std::int64_t i = 0; i < 64; ++i) w[i] = kPublishedNf4[rng.uniform_int(16)] * scale;
    w[5] = scale;  // absmax is exactly `scale`
    const auto q = QuantizedWeight::quantize(w, WeightStorage::nf4, false);
    const Tensor<float> d = q.dequantize();
    for (std::int64_t i = 0; i < 64; ++i) {
      CHECK(d[i] == w[i]);
      CHECK(kPublishedNf4[q.nf4_code(i)] * scale == w[i]);
    }
  }
}

TEST_CASE("BF16, INT8 and NF4 codes and values match the NumPy reference",
          "[core][quantized][reference]") {
  const nlohmann::json& ref = remat::test::reference("quantized.json");
  for (std::size_t i = 0; i < 16; ++i)
    CHECK(ref.at("nf4_table")[i].get<float>() == kPublishedNf4[i]);
  for (const nlohmann::json& c : ref.at("cases")) {
    const Tensor<float> w = quantized_case_tensor(c, "weight");
    INFO("weight " << w.shape());
    const std::int64_t n = w.numel();

    const Tensor<float> bf16 = QuantizedWeight::quantize(w, WeightStorage::bf16).dequantize();
    CHECK(bf16.to_vector() == quantized_case_tensor(c, "bf16").to_vector());

    const auto q8 = QuantizedWeight::quantize(w, WeightStorage::int8);
    const Tensor<float> codes8 = quantized_case_tensor(c, "int8_codes");
    for (std::int64_t e = 0; e < n; ++e) CHECK(float(q8.int8_codes()[e]) == codes8[e]);
    CHECK(q8.dequantize().to_vector() == quantized_case_tensor(c, "int8").to_vector());

    const auto q4 = QuantizedWeight::quantize(w, WeightStorage::nf4, false);
    const auto q4dq = QuantizedWeight::quantize(w, WeightStorage::nf4, true);
    const Tensor<float> codes4 = quantized_case_tensor(c, "nf4_codes");
    std::int64_t code_mismatches = 0;
    for (std::int64_t e = 0; e < n; ++e) {
      code_mismatches += float(q4.nf4_code(e)) != codes4[e];
      code_mismatches += float(q4dq.nf4_code(e)) != codes4[e];
    }
    CHECK(code_mismatches == 0);
    CHECK(quantized_bits(q4.dequantize()) == quantized_bits(quantized_case_tensor(c, "nf4")));
    // double quantization: bitsandbytes' dynamic codes of the centred absmaxes, their groups'
    // absmaxes, the offset, and the dequantized weights, bit for bit
    const Tensor<float> absmax_codes = quantized_case_tensor(c, "nf4_dq_absmax_codes");
    REQUIRE(q4dq.absmax_codes().numel() == absmax_codes.numel());
    for (std::int64_t b = 0; b < absmax_codes.numel(); ++b)
      CHECK(float(q4dq.absmax_codes()[b]) == absmax_codes[b]);
    CHECK(quantized_bits(q4dq.absmax_scales()) ==
          quantized_bits(quantized_case_tensor(c, "nf4_dq_absmax_scales")));
    CHECK(q4dq.absmax_offset() == c.at("nf4_dq_offset").get<float>());
    CHECK(quantized_bits(q4dq.dequantize()) == quantized_bits(quantized_case_tensor(c, "nf4_dq")));
    // Double instantiation: each value computed in float, then widened.
    const Tensor<double> d64 = q4dq.dequantize<double>();
    const Tensor<float> d32 = q4dq.dequantize<float>();
    for (std::int64_t e = 0; e < n; ++e) CHECK(d64[e] == double(d32[e]));
  }
}

TEST_CASE("the second-level code is bitsandbytes' dynamic map, rounded as its kernel rounds",
          "[core][quantized][reference]") {
  const nlohmann::json& ref = remat::test::reference("quantized.json");
  // the map create_dynamic_map(signed=True) builds (run by the reference script)
  REQUIRE(ref.at("dynamic_map").size() == 256);
  for (std::size_t i = 0; i < 256; ++i)
    CHECK(remat::kDynamicCodes[i] == ref.at("dynamic_map")[i].get<float>());
  // every code, every midpoint and its neighbouring floats, random values, values past the ends
  const Tensor<float> x = quantized_case_tensor(ref.at("dynamic_codes"), "x");
  const Tensor<float> codes = quantized_case_tensor(ref.at("dynamic_codes"), "codes");
  std::int64_t mismatches = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i)
    mismatches += float(remat::detail::nearest_dynamic(x[i])) != codes[i];
  CHECK(mismatches == 0);
  CHECK(x.numel() > 3000 + 256 + 3 * 255);
}

TEST_CASE("float sums and means come out as torch's CPU kernel adds them",
          "[core][quantized][reference]") {
  // torch's float32 sum of generated arrays of every length to 299 and 60 longer ones (to
  // 300,000: past its grain size, on one thread), bit for bit
  const nlohmann::json& ref = remat::test::reference("quantized.json");
  std::int64_t differs_from_exact = 0;
  for (const nlohmann::json& c : ref.at("torch_sums")) {
    const std::int64_t n = c.at("n").get<std::int64_t>();
    const auto x =
        generated_values(n, c.at("salt").get<std::uint64_t>(), c.at("scale").get<double>());
    INFO("n = " << n);
    CHECK(remat::detail::torch_cpu_sum(x.data(), n) == c.at("sum").get<float>());
    double exact = 0;
    for (const float v : x) exact += v;
    differs_from_exact += static_cast<float>(exact) != c.at("sum").get<float>();
  }
  // the order matters: a correctly rounded sum would miss many of them
  CHECK(differs_from_exact > 50);
}

TEST_CASE("the double-quantization offset is bitsandbytes' absmax.mean(), bit for bit",
          "[core][quantized][reference]") {
  // generated matrices up to 1500 x 1500; the offset torch computes from their block absmaxes
  const nlohmann::json& ref = remat::test::reference("quantized.json");
  std::int64_t exact_mean_differs = 0;
  for (const nlohmann::json& c : ref.at("offset_cases")) {
    const std::int64_t rows = c.at("rows").get<std::int64_t>(),
                       cols = c.at("cols").get<std::int64_t>();
    const double scale = c.at("scale").get<double>();
    std::vector<float> values =
        generated_values(rows * cols, c.at("salt").get<std::uint64_t>(), scale);
    for (float& v : values) v -= static_cast<float>(scale / 2);
    Tensor<float> w({rows, cols});
    std::copy(values.begin(), values.end(), w.data());
    INFO(rows << " x " << cols);
    const auto q = QuantizedWeight::quantize(w, WeightStorage::nf4, true);
    CHECK(q.absmax_offset() == c.at("offset").get<float>());
    // the same absmaxes' correctly rounded mean: where it differs, only torch's order matches
    std::vector<float> absmax;
    for (std::int64_t e0 = 0; e0 < rows * cols; e0 += 64) {
      float a = 0;
      for (std::int64_t e = e0; e < std::min(rows * cols, e0 + 64); ++e)
        a = std::max(a, std::fabs(w[e]));
      absmax.push_back(a);
    }
    exact_mean_differs += correctly_rounded_mean(absmax) != c.at("offset").get<float>();
  }
  CHECK(exact_mean_differs > 0);
}

TEST_CASE("dequantize_rows of any row range equals the same rows of the whole",
          "[core][quantized]") {
  remat::Rng rng(11);
  for (int trial = 0; trial < 30; ++trial) {
    const std::int64_t rows = 1 + rng.uniform_int(40), cols = 1 + rng.uniform_int(150);
    const Tensor<float> w = rng.normal_tensor<float>({rows, cols});
    for (WeightStorage s : {WeightStorage::bf16, WeightStorage::int8, WeightStorage::nf4}) {
      const auto q = QuantizedWeight::quantize(w, s, trial % 2 == 0);
      const Tensor<float> whole = q.dequantize();
      const std::int64_t r0 = rng.uniform_int(rows), r1 = r0 + 1 + rng.uniform_int(rows - r0);
      std::vector<float> part(std::size_t((r1 - r0) * cols));
      q.dequantize_rows(r0, r1, part.data());
      INFO(remat::to_string(s) << " (" << rows << ", " << cols << ") rows " << r0 << ".." << r1);
      CHECK(part == std::vector<float>(whole.data() + r0 * cols, whole.data() + r1 * cols));
    }
  }
}

TEST_CASE("quantization error stays within half a code gap of each block's absmax",
          "[core][quantized]") {
  remat::Rng rng(5);
  const Tensor<float> w = rng.normal_tensor<float>({96, 200});
  const auto q = QuantizedWeight::quantize(w, WeightStorage::nf4, false);
  const Tensor<float> d = q.dequantize();
  float gap = 0;
  for (int i = 1; i < 16; ++i) gap = std::max(gap, kPublishedNf4[i] - kPublishedNf4[i - 1]);
  for (std::int64_t e = 0; e < w.numel(); ++e) {
    CHECK(std::fabs(d[e] - w[e]) <= q.block_absmax(e / remat::kNf4Block) * gap / 2 * 1.0001f);
  }
}

TEST_CASE("NF4 with double quantization takes <= 0.57 bytes a parameter, counted by the allocator",
          "[core][quantized][memory]") {
  remat::Rng rng(2);
  const Tensor<float> w = rng.normal_tensor<float>({1024, 1024});
  const double n = double(w.numel());
  for (bool dq : {true, false}) {
    const std::size_t before = remat::memory::live_bytes();
    const auto q = QuantizedWeight::quantize(w, WeightStorage::nf4, dq);
    const double counted = double(remat::memory::live_bytes() - before);
    INFO("NF4 double_quant=" << dq << ": " << counted / n << " bytes a parameter");
    CHECK(counted == double(q.bytes()));
    CHECK(counted / n <= (dq ? 0.52 : 0.5626));
    CHECK(counted / n >= 0.5);
  }
  const std::size_t before = remat::memory::live_bytes();
  const auto q8 = QuantizedWeight::quantize(w, WeightStorage::int8);
  CHECK(double(remat::memory::live_bytes() - before) == n + 4 * 1024);
  const auto q16 = QuantizedWeight::quantize(w, WeightStorage::bf16);
  CHECK(double(remat::memory::live_bytes() - before) == n + 4 * 1024 + 2 * n);
}

TEST_CASE("quantize rejects empty shapes, non-matrices, non-finite values and f32",
          "[core][quantized][errors]") {
  using remat::test::error_message;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor<float> w = Tensor<float>::ones({3, 70});
  w.at({2, 65}) = nan;
  CHECK_THAT(
      error_message([&] { QuantizedWeight::quantize(w, WeightStorage::nf4); }),
      Catch::Contains("(2, 65)") && Catch::Contains("(3, 70)") && Catch::Contains("not finite"));
  CHECK_THROWS_AS(QuantizedWeight::quantize(w, WeightStorage::int8), remat::NumericError);
  CHECK_THAT(error_message([&] {
               QuantizedWeight::quantize(Tensor<float>::ones({2, 3, 4}), WeightStorage::nf4);
             }),
             Catch::Contains("(2, 3, 4)") && Catch::Contains("not a matrix"));
  CHECK_THAT(error_message([&] {
               QuantizedWeight::quantize(Tensor<float>::ones({0, 4}), WeightStorage::bf16);
             }),
             Catch::Contains("(0, 4)"));
  CHECK_THROWS_AS(QuantizedWeight::quantize(Tensor<float>::ones({2, 2}), WeightStorage::f32),
                  remat::ArgumentError);
}
