#pragma once
// Private: what an exception says, for messages that report another failure.
#include <exception>
#include <string>

namespace mirrored::detail {

/// `what()` of the exception, or a note that it is not a std::exception.
std::string describe_exception(const std::exception_ptr& e);

}  // namespace mirrored::detail
