#pragma once
// One family of exceptions for all of tandem. Every error carries the failing expression,
// the file and line, and a message a user can act on.
#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, const char* expression, const char* file, int line);
  const std::string& message() const { return message_; }  // the message without location
  const std::string& expression() const { return expression_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  std::string expression_;
  std::string file_;
  int line_;
};

// Bad argument value or shape.
class ValueError : public Error { using Error::Error; };
// Unsupported or mismatched dtype.
class TypeError : public Error { using Error::Error; };
// Tensors on the wrong or mismatched devices; a backend this build lacks.
class DeviceError : public Error { using Error::Error; };
// Index or dim out of range.
class IndexError : public Error { using Error::Error; };
// A path that exists in the API but not (yet) for this device or dtype.
class NotImplementedError : public Error { using Error::Error; };
// An allocator could not satisfy a request.
class OutOfMemoryError : public Error { using Error::Error; };
// A failure inside a library we call (CUDA, cuBLAS, cuDNN, NCCL, MPI) or the OS.
class BackendError : public Error { using Error::Error; };
// A call that cannot run inside a CUDA graph capture (core/cuda_graph.h); the message names it.
class GraphCaptureError : public Error { using Error::Error; };

namespace detail {
inline void append(std::ostringstream&) {}
template <typename T, typename... Rest>
void append(std::ostringstream& out, const T& first, const Rest&... rest) {
  out << first;
  append(out, rest...);
}
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  append(out, args...);
  return out.str();
}
}  // namespace detail

}  // namespace tandem

// TANDEM_CHECK(cond, msg...) throws tandem::Error; TANDEM_CHECK_AS(ValueError, cond, msg...) picks
// the exception type. The message parts are streamed together: TANDEM_CHECK(a == b, "got ", a).
#define TANDEM_CHECK_AS(ErrorType, cond, ...)                                               \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      throw ::tandem::ErrorType(::tandem::detail::concat(__VA_ARGS__), #cond, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)
#define TANDEM_CHECK(cond, ...) TANDEM_CHECK_AS(Error, cond, __VA_ARGS__)
#define TANDEM_THROW(ErrorType, ...) \
  throw ::tandem::ErrorType(::tandem::detail::concat(__VA_ARGS__), "", __FILE__, __LINE__)
