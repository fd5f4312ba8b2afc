#pragma once
/// \file
/// Typed errors mirroring TensorFlow's status codes. Every error the library throws derives from
/// `mirrored::Error`; callers can catch a specific subclass or the base and inspect `code()`.

#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "mirrored/config.hpp"

namespace mirrored {

/// TensorFlow's canonical status codes (the subset the library raises).
enum class ErrorCode {
  INVALID_ARGUMENT = 3,
  DEADLINE_EXCEEDED = 4,
  NOT_FOUND = 5,
  PERMISSION_DENIED = 7,
  FAILED_PRECONDITION = 9,
  ABORTED = 10,
  OUT_OF_RANGE = 11,
  UNIMPLEMENTED = 12,
  INTERNAL = 13,
  UNAVAILABLE = 14,
};

/// Name of a code as TF spells it, e.g. "INVALID_ARGUMENT".
const char* error_code_name(ErrorCode code) noexcept;

/// Base of every library error. `what()` is the message; `code()` the status code.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  /// The TF status code this error corresponds to.
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

#define MIRRORED_DEFINE_ERROR(Name, Code)                                          \
  /** Error with status code Code. */                                              \
  class Name : public Error {                                                      \
   public:                                                                         \
    explicit Name(const std::string& message) : Error(ErrorCode::Code, message) {} \
  };

/// Bad argument value or shape (TF's ValueError / InvalidArgumentError).
MIRRORED_DEFINE_ERROR(InvalidArgumentError, INVALID_ARGUMENT)
/// Operation used in the wrong state or context (TF's RuntimeError on misuse).
MIRRORED_DEFINE_ERROR(FailedPreconditionError, FAILED_PRECONDITION)
/// Iteration past the end, or an index out of range.
MIRRORED_DEFINE_ERROR(OutOfRangeError, OUT_OF_RANGE)
/// A wait ran past its deadline (e.g. a replica never joined a collective).
MIRRORED_DEFINE_ERROR(DeadlineExceededError, DEADLINE_EXCEEDED)
/// A resource (device, peer) is currently unavailable.
MIRRORED_DEFINE_ERROR(UnavailableError, UNAVAILABLE)
/// The operation was cancelled because another replica failed.
MIRRORED_DEFINE_ERROR(AbortedError, ABORTED)
/// A named entity (device, file, tensor) does not exist.
MIRRORED_DEFINE_ERROR(NotFoundError, NOT_FOUND)
/// The caller may not do this (a file it may not read, e.g. EACCES).
MIRRORED_DEFINE_ERROR(PermissionDeniedError, PERMISSION_DENIED)
/// The operation is not supported by this backend or build (TF's NotImplementedError).
MIRRORED_DEFINE_ERROR(UnimplementedError, UNIMPLEMENTED)
/// An invariant of the library itself was broken.
MIRRORED_DEFINE_ERROR(InternalError, INTERNAL)

#undef MIRRORED_DEFINE_ERROR

namespace detail {

/// Builds a message from parts formatted exactly as one `std::ostringstream` formats them. The
/// stream lives in the compiled library: a message costs its caller one call per part rather than
/// the stream's inline code, and this header does not need <sstream>.
class MessageBuilder {
 public:
  MessageBuilder();
  ~MessageBuilder();
  MessageBuilder(const MessageBuilder&) = delete;
  MessageBuilder& operator=(const MessageBuilder&) = delete;

  void append(std::string_view text);
  void append(char c);
  void append(signed char c);
  void append(unsigned char c);
  void append(bool b);
  void append(short v);
  void append(unsigned short v);
  void append(int v);
  void append(long v);
  void append(long long v);
  void append(unsigned v);
  void append(unsigned long v);
  void append(unsigned long long v);
  void append(double v);
  void append(long double v);
  void append(const void* p);
  /// The stream itself, for parts of other types: they are written with their `operator<<` (whose
  /// declaration, and <ostream>, the caller provides).
  std::ostream& stream();
  /// What has been written so far.
  std::string str() const;

 private:
  std::unique_ptr<std::ostringstream> os_;
};

/// Writes one part of a message as `std::ostream`'s `operator<<` does.
template <class P>
void append_part(MessageBuilder& b, const P& part) {
  if constexpr (std::is_convertible_v<const P&, std::string_view>) {
    b.append(std::string_view(part));
  } else if constexpr (std::is_arithmetic_v<P> && !std::is_same_v<P, float> && !std::is_same_v<P, wchar_t> &&
                       !std::is_same_v<P, char8_t> && !std::is_same_v<P, char16_t> && !std::is_same_v<P, char32_t>) {
    b.append(part);  // an overload of exactly P: every other arithmetic type
  } else if constexpr (std::is_same_v<P, float>) {
    b.append(static_cast<double>(part));  // as std::ostream writes a float
  } else if constexpr (std::is_pointer_v<P> && !std::is_function_v<std::remove_pointer_t<P>>) {
    b.append(static_cast<const void*>(part));
  } else {
    b.stream() << part;
  }
}

/// Concatenates streamable parts into one string (used to build error messages).
template <class... Parts>
std::string str_cat(const Parts&... parts) {
  MessageBuilder b;
  (append_part(b, parts), ...);
  return b.str();
}

}  // namespace detail
}  // namespace mirrored

/// Throws `ErrorType` with a message built from the streamable parts when `cond` is false.
#define MIRRORED_ENFORCE(cond, ErrorType, ...)                   \
  do {                                                           \
    if (!(cond)) {                                               \
      throw ErrorType(::mirrored::detail::str_cat(__VA_ARGS__)); \
    }                                                            \
  } while (0)

/// Throws `ErrorType` when `a == b` does not hold; the message shows both values.
#define MIRRORED_ENFORCE_EQ(a, b, ErrorType, ...)                                                                 \
  do {                                                                                                            \
    const auto& mirrored_lhs_ = (a);                                                                              \
    const auto& mirrored_rhs_ = (b);                                                                              \
    if (!(mirrored_lhs_ == mirrored_rhs_)) {                                                                      \
      throw ErrorType(::mirrored::detail::str_cat(__VA_ARGS__, " (", #a, " = ", mirrored_lhs_, " vs ", #b, " = ", \
                                                  mirrored_rhs_, ")"));                                           \
    }                                                                                                             \
  } while (0)
