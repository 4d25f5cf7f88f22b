// "key=value" lines: the one text format of the settings every rank must agree on (the
// handshake's and the checkpoints' settings, dgc/exchange/exchange.h) and of the rendezvous
// records (dgc/comm). Pure; thread-safe.
#pragma once

#include <map>
#include <string>
#include <string_view>

namespace dgc {

// The lines of `text` as a map: a line splits at its first '=' (a line without '=' maps to ""),
// empty lines and a trailing '\r' are ignored, and a later line overrides an earlier one with the
// same key. Never throws but std::bad_alloc.
std::map<std::string, std::string> parse_key_value_lines(std::string_view text);

}  // namespace dgc
