// Python's random module as lm-eval's few-shot sampler uses it: Random(seed) seeds MT19937 with
// init_by_array over the seed's 32-bit words (Matsumoto & Nishimura 1998, CPython
// Modules/_randommodule.c); sample() draws with _randbelow (getrandbits(k) by rejection) from a
// pool when the population is small, else by rejecting repeats (Lib/random.py, 3.11 and 3.12).
#include <cmath>
#include <set>
#include <stdexcept>

#include "trainrun/eval/harness.hpp"

namespace trainrun::eval {

namespace {
constexpr int kN = 624, kM = 397;
}

PythonRandom::PythonRandom(uint64_t seed) {
  std::vector<uint32_t> key;
  for (uint64_t s = seed; s != 0; s >>= 32) key.push_back(static_cast<uint32_t>(s & 0xffffffffu));
  if (key.empty()) key.push_back(0);
  mt_[0] = 19650218u;
  for (int i = 1; i < kN; ++i)
    mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(kN, key.size()); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] +
             static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt_[i] =
        (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
  mti_ = kN;
}

uint32_t PythonRandom::genrand_uint32() {
  static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
  if (mti_ >= kN) {
    int kk = 0;
    for (; kk < kN - kM; ++kk) {
      const uint32_t y = (mt_[kk] & 0x80000000u) | (mt_[kk + 1] & 0x7fffffffu);
      mt_[kk] = mt_[kk + kM] ^ (y >> 1) ^ mag01[y & 1u];
    }
    for (; kk < kN - 1; ++kk) {
      const uint32_t y = (mt_[kk] & 0x80000000u) | (mt_[kk + 1] & 0x7fffffffu);
      mt_[kk] = mt_[kk + (kM - kN)] ^ (y >> 1) ^ mag01[y & 1u];
    }
    const uint32_t y = (mt_[kN - 1] & 0x80000000u) | (mt_[0] & 0x7fffffffu);
    mt_[kN - 1] = mt_[kM - 1] ^ (y >> 1) ^ mag01[y & 1u];
    mti_ = 0;
  }
  uint32_t y = mt_[mti_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

uint32_t PythonRandom::getrandbits(int k) {
  if (k <= 0) return 0;
  return genrand_uint32() >> (32 - k);
}

int64_t PythonRandom::randbelow(int64_t n) {
  if (n >= (int64_t{1} << 32)) throw std::invalid_argument("PythonRandom: population too large");
  int k = 0;
  for (uint64_t v = static_cast<uint64_t>(n); v != 0; v >>= 1) ++k;  // n.bit_length()
  int64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::vector<int64_t> PythonRandom::sample(int64_t n, int64_t k) {
  if (k < 0 || k > n) throw std::invalid_argument("Sample larger than population or is negative");
  std::vector<int64_t> result(static_cast<size_t>(k));
  int64_t setsize = 21;
  // 4 ** ceil(log(k * 3, 4)), computed as Python does, in floating point.
  if (k > 5)
    setsize += static_cast<int64_t>(
        std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = randbelow(n - i);
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::set<int64_t> selected;
    for (int64_t i = 0; i < k; ++i) {
      int64_t j = randbelow(n);
      while (selected.count(j) != 0) j = randbelow(n);
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

}  // namespace trainrun::eval
