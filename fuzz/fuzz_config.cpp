// libFuzzer target: the bytes are a Hugging Face config.json, read by parse_hf_config
// (nn/hf_model.hpp: the text half of load_hf_config). A read either throws tightfit::error or
// yields a configuration that validates and whose parameter count is within the declared maximum:
// any other exception, a sanitizer report, a leak or a timeout is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "tightfit/nn/hf_model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const tightfit::model_config c = tightfit::parse_hf_config(text, "fuzz");
    c.validate();
    const auto n = tightfit::hf_parameter_count(c);
    if (!n || *n > tightfit::max_hf_parameters) std::abort();  // the declared maximum holds
  } catch (const tightfit::error&) {
  }
  return 0;
}
