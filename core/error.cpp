#include "tandem/core/error.h"

namespace tandem {

namespace {
std::string full_message(const std::string& message, const char* expression, const char* file,
                         int line) {
  std::string text = message;
  text += " (at ";
  text += file;
  text += ":" + std::to_string(line);
  if (expression != nullptr && expression[0] != '\0') {
    text += ", check failed: ";
    text += expression;
  }
  text += ")";
  return text;
}
}  // namespace

Error::Error(const std::string& message, const char* expression, const char* file, int line)
    : std::runtime_error(full_message(message, expression, file, line)),
      message_(message),
      expression_(expression == nullptr ? "" : expression),
      file_(file),
      line_(line) {}

}  // namespace tandem
