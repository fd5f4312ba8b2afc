#include "mirrored/errors.hpp"

namespace mirrored {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case ErrorCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case ErrorCode::NOT_FOUND: return "NOT_FOUND";
    case ErrorCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case ErrorCode::ABORTED: return "ABORTED";
    case ErrorCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case ErrorCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case ErrorCode::INTERNAL: return "INTERNAL";
    case ErrorCode::UNAVAILABLE: return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

}  // namespace mirrored
