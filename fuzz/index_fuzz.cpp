// libFuzzer target: any bytes given to the index reader (model.safetensors.index.json) either
// end in a remat::Error or parse into a weight map whose every shard names a file inside the
// folder; written back as JSON, that map parses to the same thing. Anything else (a crash, a
// sanitizer report, another exception, a shard outside the folder) is a bug.
#include <remat/io/weight_files.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto index = remat::io::detail::parse_index(text, "fuzz input");
    nlohmann::json again = {{"weight_map", nlohmann::json::object()}};
    for (const auto& [name, shard] : index.weight_map) {
      check(remat::io::detail::is_inside_folder(shard));
      again["weight_map"][name] = shard;
    }
    if (index.total_size) again["metadata"] = {{"total_size", *index.total_size}};
    const std::string written = again.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
    const auto back = remat::io::detail::parse_index(written, "fuzz output");
    check(back.weight_map == index.weight_map && back.total_size == index.total_size);
  } catch (const remat::Error&) {
    // rejected with a clear error: what we want for bad input
  } catch (const nlohmann::json::exception&) {
    // dump(strict) of a name that is not UTF-8: parse_index accepted it (nlohmann checks UTF-8
    // while parsing, so this should not happen); abort to find out
    std::abort();
  }
  return 0;
}
