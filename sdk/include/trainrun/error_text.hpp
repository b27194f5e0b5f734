#pragma once
// The text of an exception for a message that quotes it. Apart from error.hpp, which needs no
// LibTorch header (the text library includes it without LibTorch).
#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace trainrun::v1 {

/// The message of any exception: c10::Error's (LibTorch's TORCH_CHECK, c10d's store, Gloo's
/// errors as LibTorch rethrows them) without the C++ backtrace its what() appends, any other's
/// what().
inline std::string what_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

}  // namespace trainrun::v1
