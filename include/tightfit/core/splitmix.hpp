// tightfit/core/splitmix.hpp: splitmix64 (Steele, Lea and Flood, "Fast Splittable Pseudorandom
// Number Generators", OOPSLA 2014), the generator and its finaliser as a counter-based hash: a
// draw that is a pure function of its coordinates (a seed and a few integers), the same on every
// machine and in every order of evaluation, with no generator state to carry between calls.
// Users: the seeded data order (optim/data_order.hpp) and LoRA dropout's masks
// (nn/lora_dropout.hpp). Not for security.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace tightfit {

/// splitmix64's increment (2^64 / golden ratio, odd).
inline constexpr std::uint64_t splitmix64_gamma = 0x9E3779B97F4A7C15ULL;

/// splitmix64's finaliser (Stafford's "Mix13"): a bijection of 64-bit words whose every output
/// bit depends on every input bit.
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// splitmix64: one step of the generator (state += gamma, then the finaliser).
inline std::uint64_t splitmix64(std::uint64_t& state) {
  return splitmix64_mix(state += splitmix64_gamma);
}

/// The k-th draw (k >= 0) of the splitmix64 stream that starts at `state`, without stepping
/// through the k before it: splitmix64 called k + 1 times from `state` returns this.
constexpr std::uint64_t splitmix64_at(std::uint64_t state, std::uint64_t k) {
  return splitmix64_mix(state + (k + 1) * splitmix64_gamma);
}

/// A key of an ordered list of words under `seed`: each word is folded in through the
/// finaliser (key = mix(key ^ mix(word + (i + 1) gamma)) for word i), so lists that differ in
/// any word or in order give unrelated keys.
constexpr std::uint64_t splitmix64_key(std::uint64_t seed,
                                       std::initializer_list<std::uint64_t> words) {
  std::uint64_t key = splitmix64_mix(seed);
  std::uint64_t i = 0;
  for (const std::uint64_t w : words) key = splitmix64_mix(key ^ splitmix64_at(w, i++));
  return key;
}

}  // namespace tightfit
