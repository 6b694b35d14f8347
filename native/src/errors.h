// The one exception type of the compute core: a code the TS layer maps onto RlstreamError, and a precise message.
#pragma once
#include <stdexcept>
#include <string>

namespace rls {

enum class ErrCode { InvalidArgument, NonFinite };

struct NativeError : std::runtime_error {
  ErrCode code;
  NativeError(ErrCode c, const std::string& msg) : std::runtime_error(msg), code(c) {}
};

inline const char* err_code_name(ErrCode c) {
  return c == ErrCode::NonFinite ? "NATIVE_NON_FINITE" : "NATIVE_INVALID_ARGUMENT";
}

[[noreturn]] inline void invalid(const std::string& msg) { throw NativeError(ErrCode::InvalidArgument, msg); }
[[noreturn]] inline void non_finite(const std::string& msg) { throw NativeError(ErrCode::NonFinite, msg); }

}  // namespace rls
