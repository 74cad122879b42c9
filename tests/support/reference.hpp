#pragma once
// PyTorch reference data for the tests (tests/reference/*.json, written by
// tests/reference/make_reference.py with torch 1.13 in double). Differences are measured relative
// to the largest magnitude in the reference tensor, so that an entry near 0 is held to the scale
// of its neighbours rather than to its own tiny size.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <remat/remat.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>

#ifndef REMAT_REFERENCE_DIR
#error "define REMAT_REFERENCE_DIR as the path of tests/reference"
#endif

namespace remat::test {

/// The parsed JSON file tests/reference/<name>.
inline const nlohmann::json& reference(const std::string& name) {
  static std::map<std::string, nlohmann::json> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    std::ifstream in(std::string(REMAT_REFERENCE_DIR) + "/" + name);
    REQUIRE(in.good());
    it = cache.emplace(name, nlohmann::json::parse(in)).first;
  }
  return it->second;
}

inline Shape json_shape(const nlohmann::json& t) {
  const std::vector<std::int64_t> dims = t.at("shape").get<std::vector<std::int64_t>>();
  return Shape(std::span<const std::int64_t>(dims));
}

/// A {"shape": [...], "data": [...]} object as a Tensor<T>.
template <class T>
Tensor<T> json_tensor(const nlohmann::json& t) {
  Tensor<T> out(json_shape(t));
  const nlohmann::json& data = t.at("data");
  REQUIRE(static_cast<std::int64_t>(data.size()) == out.numel());
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const nlohmann::json& v = data[static_cast<std::size_t>(i)];
    if constexpr (std::is_same_v<T, bool>) {
      out[i] = v.get<int>() != 0;  // masks are written as 0 and 1
    } else {
      out[i] = v.get<T>();
    }
  }
  return out;
}

/// The largest relative difference of `got` from `want`, relative to want's largest magnitude.
inline double relative_difference(const Tensor<double>& got, const Tensor<double>& want) {
  REQUIRE(got.shape() == want.shape());
  double scale = 0, diff = 0;
  for (std::int64_t i = 0; i < want.numel(); ++i) {
    scale = std::max(scale, std::abs(want[i]));
    diff = std::max(diff, std::abs(got[i] - want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

}  // namespace remat::test
