// A user's program built against an installed dgc: exact top-3 of a small vector.
#include <cstdio>
#include <vector>

#include "dgc/core/selection.h"

int main() {
  std::vector<float> velocity = {0.1f, -5.0f, 0.2f, 3.0f, 0.0f, 4.0f};
  dgc::Selection selection;
  dgc::select_exact(velocity, 3, selection);
  std::printf("selected %zu\n", selection.indices.size());
  return selection.indices == std::vector<uint32_t>{1, 3, 5} ? 0 : 1;
}
