// Gloo throws three unrelated exception types; the rendezvous code turns each into a CommError
// with context through with_gloo_errors. Private to dgc::comm.
#pragma once

#include <gloo/common/error.h>

#include <string>

#include "dgc/core/error.h"

namespace dgc::comm {

template <typename F>
auto with_gloo_errors(const std::string& what, F&& body) {
  try {
    return body();
  } catch (const gloo::IoException& e) {
    throw CommError(what + ": " + e.what());
  } catch (const gloo::EnforceNotMet& e) {
    throw CommError(what + ": " + e.what());
  } catch (const gloo::Exception& e) {
    throw CommError(what + ": " + e.what());
  }
}

}  // namespace dgc::comm
