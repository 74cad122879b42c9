// libFuzzer target: any bytes given to the safetensors reader either parse into tensors that can
// all be read, or end in a remat::Error. Anything else (a crash, a sanitizer report, another
// exception) is a bug.
#include <remat/io/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const remat::io::File file("fuzz input", std::vector<char>(data, data + size));
    for (const auto& [name, entry] : file.entries()) {
      if (entry.dtype == "F32") (void)file.tensor<float>(name);
      else (void)file.tensor<double>(name);
    }
  } catch (const remat::Error&) {
    // rejected with a clear error: what we want for bad input
  }
  return 0;
}
