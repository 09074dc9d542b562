// User errors versus internal errors, shared by every layer of flowjit.
//
// A UserError is the user's fault (a bad shape, dtype, argument, config) and
// becomes a TypeError/ValueError/NotImplementedError in Python with its message
// unchanged. An InternalError is a flowjit bug; Python shows it as a
// RuntimeError whose message says so.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace flowjit {

// Index: a run found an index outside its range (Python IndexError);
// FloatingPoint: check_numerics found a NaN or infinity (FloatingPointError).
enum class ErrorKind { Type, Value, NotImplemented, Runtime, Index, FloatingPoint, Memory };

// A compile stopped because the user asked (Ctrl-C): the caller that asked
// knows why (the bindings re-raise Python's KeyboardInterrupt).
class Interrupted : public std::runtime_error {
 public:
  Interrupted() : std::runtime_error("flowjit: compile interrupted") {}
};

class UserError : public std::runtime_error {
 public:
  UserError(ErrorKind kind, std::string msg) : std::runtime_error(std::move(msg)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& msg) : std::logic_error(msg) {}
};

namespace detail {
inline void append(std::ostringstream&) {}
template <class T, class... Rest>
void append(std::ostringstream& os, const T& first, const Rest&... rest) {
  os << first;
  append(os, rest...);
}
}  // namespace detail

// str(a, b, c) concatenates anything printable with <<.
template <class... Args>
std::string str(const Args&... args) {
  std::ostringstream os;
  detail::append(os, args...);
  return os.str();
}

template <class... Args>
[[noreturn]] void throw_user(ErrorKind kind, const Args&... args) {
  throw UserError(kind, str(args...));
}

template <class... Args>
[[noreturn]] void throw_internal(const char* file, int line, const Args&... args) {
  throw InternalError(str("flowjit internal error (a bug in flowjit, please report it) at ", file,
                          ":", line, ": ", args...));
}

}  // namespace flowjit

// user_check: the condition is the user's responsibility.
#define FJ_USER_CHECK(cond, kind, ...)                     \
  do {                                                     \
    if (!(cond)) ::flowjit::throw_user(kind, __VA_ARGS__); \
  } while (0)

// internal_check: the condition is an invariant of flowjit itself.
#define FJ_CHECK(cond, ...)                                                                \
  do {                                                                                     \
    if (!(cond)) ::flowjit::throw_internal(__FILE__, __LINE__, #cond ": ", ##__VA_ARGS__); \
  } while (0)
