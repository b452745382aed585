// Includes the umbrella header and runs one kernel: proves the package is usable as installed.
#include <tightfit/tightfit.hpp>

#include <cstdio>
#include <string>

int main() {
  tightfit::memory_counter counter;
  tightfit::host_buffer<double> buffer(counter, 4);
  std::printf("tightfit consumer: %zu bytes counted\n", counter.live());
#if defined(TIGHTFIT_HAS_TEXT) && TIGHTFIT_HAS_TEXT
  // tightfit::text: PCRE2 (a split regex) and utf8proc (NFC) linked through the package
  const tightfit::text::split_regex re("\\p{L}+");
  tightfit::text::split_regex::matcher m(re);
  int words = 0;
  m.split("two words", true, [&](std::size_t, std::size_t, bool) { ++words; });
  const std::string nfc = tightfit::text::normalize(
      "e\xCC\x81", {{tightfit::text::normalizer_step::kind::nfc, "", ""}});
  std::printf("tightfit consumer: text component: %d words, NFC %s\n", words,
              nfc == "\xC3\xA9" ? "ok" : "wrong");
  if (words != 2 || nfc != "\xC3\xA9") return 1;
#endif
  return counter.live() == 4 * sizeof(double) ? 0 : 1;
}
