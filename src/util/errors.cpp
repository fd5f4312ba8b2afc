#include "mirrored/errors.hpp"

#include <sstream>

#include "util/exceptions.hpp"

namespace mirrored {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case ErrorCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case ErrorCode::NOT_FOUND: return "NOT_FOUND";
    case ErrorCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
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

namespace mirrored::detail {

std::string describe_exception(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace mirrored::detail

namespace mirrored::detail {

MessageBuilder::MessageBuilder() : os_(std::make_unique<std::ostringstream>()) {}
MessageBuilder::~MessageBuilder() = default;

void MessageBuilder::append(std::string_view text) { *os_ << text; }
void MessageBuilder::append(char c) { *os_ << c; }
void MessageBuilder::append(signed char c) { *os_ << c; }
void MessageBuilder::append(unsigned char c) { *os_ << c; }
void MessageBuilder::append(bool b) { *os_ << b; }
void MessageBuilder::append(short v) { *os_ << v; }
void MessageBuilder::append(unsigned short v) { *os_ << v; }
void MessageBuilder::append(int v) { *os_ << v; }
void MessageBuilder::append(long v) { *os_ << v; }
void MessageBuilder::append(long long v) { *os_ << v; }
void MessageBuilder::append(unsigned v) { *os_ << v; }
void MessageBuilder::append(unsigned long v) { *os_ << v; }
void MessageBuilder::append(unsigned long long v) { *os_ << v; }
void MessageBuilder::append(double v) { *os_ << v; }
void MessageBuilder::append(long double v) { *os_ << v; }
void MessageBuilder::append(const void* p) { *os_ << p; }
std::ostream& MessageBuilder::stream() { return *os_; }
std::string MessageBuilder::str() const { return os_->str(); }

}  // namespace mirrored::detail
