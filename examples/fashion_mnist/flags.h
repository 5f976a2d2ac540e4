#pragma once
// Checks for fashion_mnist's numeric flags that say in words what is allowed. They run on the
// text before CLI11 converts it, so "abc", "-1" for an unsigned flag and "0" for a count are all
// caught here: "--epochs: 0 is not allowed: expected a whole number of at least 1".
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

namespace fashion {

// A whole number from `min` to int64's maximum.
inline CLI::Validator whole_number_at_least(int64_t min) {
  std::string expected = "a whole number of at least " + std::to_string(min);
  return CLI::Validator(
      [min, expected](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        long long v = std::strtoll(text.c_str(), &end, 10);
        bool whole = !text.empty() && end == text.c_str() + text.size() && errno != ERANGE;
        if (whole && v >= min) return "";
        return "'" + text + "' is not allowed: expected " + expected;
      },
      expected);
}

// A finite number above `low` (or from `low`, when inclusive).
inline CLI::Validator number_above(double low, bool inclusive) {
  std::ostringstream bound;
  bound << low;
  std::string expected = std::string("a number ") + (inclusive ? "of at least " : "above ") + bound.str();
  return CLI::Validator(
      [low, inclusive, expected](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        double v = std::strtod(text.c_str(), &end);
        bool number = !text.empty() && end == text.c_str() + text.size() && errno != ERANGE && std::isfinite(v);
        if (number && (inclusive ? v >= low : v > low)) return "";
        return "'" + text + "' is not allowed: expected " + expected;
      },
      expected);
}

}  // namespace fashion
