#pragma once
// What one rendering of a chat template may cost. A model directory is untrusted input, and the
// sandbox's own limits (range() size, recursion depth, repetition count) leave templates that
// grow a string, list or dict in a loop, or loop without producing anything, free to take the
// machine. A Budget counts the bytes a rendering builds (every string, list and dict it makes,
// and its output) and the operations it executes (loop iterations and calls, weighted by the
// size of what they scan); exceeding either throws LimitError naming the limit and its override.
#include <cstdint>
#include <string>

#include "jinja_value.hpp"

namespace trainrun::text::jinja {

/// A budget of one rendering was exhausted; what() names the limit, its value and how to raise it.
class LimitError : public Error {
 public:
  LimitError(const std::string& message, int line) : Error(message, line) {}
};

class Budget {
 public:
  Budget(uint64_t max_bytes, uint64_t max_operations)
      : max_bytes_(max_bytes), max_ops_(max_operations) {}

  /// Charges `n` bytes about to be built (saturating: a huge n fails instead of wrapping).
  void bytes(uint64_t n, int line) {
    if (n > max_bytes_ - bytes_) over_bytes(line);
    bytes_ += n;
  }
  /// Throws unless a value of `size` bytes could still be built (a check inside a builder that
  /// charges its result afterwards).
  void fits(uint64_t size, int line) const {
    if (size > max_bytes_ - bytes_) over_bytes(line);
  }
  /// Charges `n` operations.
  void operations(uint64_t n, int line) {
    if (n > max_ops_ - ops_) over_operations(line);
    ops_ += n;
  }
  uint64_t bytes_used() const { return bytes_; }
  uint64_t operations_used() const { return ops_; }

  /// The template line being executed, for charges made where the line is not at hand (0).
  int line = 0;

  /// The budget of the rendering running on this thread (nullptr outside a rendering).
  static Budget* current();
  /// Makes `b` the current budget of this thread for the lifetime of the object.
  class Install {
   public:
    explicit Install(Budget& b);
    ~Install();
    Install(const Install&) = delete;
    Install& operator=(const Install&) = delete;

   private:
    Budget* saved_;
  };

 private:
  [[noreturn]] void over_bytes(int line) const;
  [[noreturn]] void over_operations(int line) const;
  uint64_t max_bytes_, max_ops_;
  uint64_t bytes_ = 0, ops_ = 0;
};

/// a * b, saturating at UINT64_MAX (sizes computed from template-given counts and widths).
inline uint64_t saturating_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/// The bytes `v` itself holds: a string's length; a list's or dict's slots and string items
/// (shared nested containers are not counted again: they are shared, not copied).
uint64_t value_bytes(const Value& v);

/// Charges the current rendering's budget (no-op outside a rendering); line 0: the current line.
void charge_bytes(uint64_t n, int line);
/// Throws if a value of `size` bytes would exceed the current rendering's byte budget.
void check_fits(uint64_t size, int line);
void charge_operations(uint64_t n, int line);

}  // namespace trainrun::text::jinja
