#pragma once
/// What an exception says in one message: c10::Error::what() appends a C++ backtrace (and, in
/// some builds, a second copy of the message) that no user should see.

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace fsdp {

/// `e`'s message without the C++ backtrace that c10::Error::what() appends.
///
/// Example:
///   catch (const std::exception& e) { error = fsdp::message_of(e); }
inline std::string message_of(const std::exception& e) {
  if (auto* error = dynamic_cast<const c10::Error*>(&e)) return error->what_without_backtrace();
  return e.what();
}

}  // namespace fsdp
