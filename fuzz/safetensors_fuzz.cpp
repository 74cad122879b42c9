// libFuzzer target: any bytes given to the safetensors reader either end in a remat::Error or
// parse into tensors that can all be read and that remat's writer writes back into a file the
// reader reads as the same thing (names, dtypes, shapes, bytes, metadata). Anything else (a
// crash, a sanitizer report, another exception, a file remat cannot read back) is a bug.
#include <remat/io/safetensors.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <tuple>
#include <vector>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

/// Writes what `file` holds with remat's writer, in the order of the file's offsets.
std::vector<char> rewrite(const remat::io::File& file) {
  std::vector<std::tuple<std::size_t, std::size_t, std::string>> order;
  for (const auto& [name, e] : file.entries()) order.emplace_back(e.begin, e.end, name);
  std::sort(order.begin(), order.end());
  std::vector<remat::io::detail::HeaderEntry> entries;
  std::string data;
  for (const auto& [begin, end, name] : order) {
    const auto& e = file.entry(name);
    entries.push_back({name, e.dtype, e.shape, end - begin});
    const auto bytes = file.bytes(name);
    data.append(bytes.data(), bytes.size());
  }
  const std::string out =
      remat::io::detail::encode_header("fuzz output", entries, file.metadata()) + data;
  return {out.begin(), out.end()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<char> bytes(data, data + size);
  try {
    const remat::io::File file("fuzz input", std::move(bytes));
    for (const auto& [name, entry] : file.entries()) {
      // every dtype reads as what it says it reads as (an integer out of int32's range is an
      // IoError, caught below), and F8 dtypes read as nothing
      if (file.reads_as<float>(name)) (void)file.tensor<float>(name);
      if (file.reads_as<double>(name)) (void)file.tensor<double>(name);
      if (file.reads_as<std::int32_t>(name)) (void)file.tensor<std::int32_t>(name);
    }
    // remat's writer refuses the empty name (the reader, like the reference, accepts it)
    if (file.contains("")) return 0;
    const remat::io::File again("fuzz output", rewrite(file));
    check(again.metadata() == file.metadata());
    check(again.entries().size() == file.entries().size());
    for (const auto& [name, e] : file.entries()) {
      const auto& f = again.entry(name);
      check(f.dtype == e.dtype && f.shape == e.shape && f.end - f.begin == e.end - e.begin);
      const auto a = file.bytes(name), b = again.bytes(name);
      check(std::equal(a.begin(), a.end(), b.begin(), b.end()));
    }
  } catch (const remat::Error&) {
    // rejected with a clear error: what we want for bad input
  }
  return 0;
}
