#include "dgc/core/key_value.h"

namespace dgc {

std::map<std::string, std::string> parse_key_value_lines(std::string_view text) {
  std::map<std::string, std::string> out;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view() : text.substr(end + 1);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      out[std::string(line)] = "";
    } else {
      out[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
    }
  }
  return out;
}

}  // namespace dgc
