#include "dgc/exchange/dense_path.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "dgc/core/bytes.h"
#include "dgc/core/error.h"
#include "dgc/core/float16.h"

namespace dgc {

uint64_t sum_dense_path(const DensePathOptions& options, std::span<float> dense_flat) {
  const MessageAuthenticator* auth = options.job.auth();
  const uint64_t iteration = options.iteration;
  if (options.value_type == ValueType::kFloat32 && auth == nullptr) {
    options.comm.allreduce_sum(dense_flat, options.timeout);
    return 0;
  }
  // One buffer per rank, little endian (fp32, or 16-bit values), with a job key followed by its
  // tag over the run id, the iteration and the sender.
  const auto type = options.value_type;
  const size_t width = type == ValueType::kFloat32 ? 4 : 2;
  const size_t values_bytes = width * dense_flat.size();
  std::vector<uint8_t> mine(values_bytes);
  for (size_t e = 0; e < dense_flat.size(); ++e) {
    uint8_t* at = mine.data() + width * e;
    if (type == ValueType::kFloat32) {
      store_le(at, std::bit_cast<uint32_t>(dense_flat[e]));
    } else {
      store_le(at, type == ValueType::kFloat16 ? fp16_from_float(dense_flat[e])
                                               : bf16_from_float(dense_flat[e]));
    }
  }
  const auto tag_input = [&](int sender) {
    std::array<uint8_t, 4 + kRunIdBytes + 8 + 4> out{'D', 'G', 'C', 'D'};
    std::memcpy(out.data() + 4, options.job.run_id.data(), kRunIdBytes);
    store_le(out.data() + 4 + kRunIdBytes, static_cast<uint64_t>(iteration));
    store_le(out.data() + 4 + kRunIdBytes + 8, static_cast<uint32_t>(sender));
    return out;
  };
  if (auth != nullptr) {
    const Tag tag = auth->tag({tag_input(options.comm.rank()), mine});
    mine.insert(mine.end(), tag.begin(), tag.end());
  }
  const auto all = options.comm.allgatherv(mine, options.timeout);
  const auto value = [type, width](const std::vector<uint8_t>& bytes, size_t e) {
    const uint8_t* at = bytes.data() + width * e;
    return type == ValueType::kFloat32   ? std::bit_cast<float>(load_le<uint32_t>(at))
           : type == ValueType::kFloat16 ? fp16_to_float(load_le<uint16_t>(at))
                                         : bf16_to_float(load_le<uint16_t>(at));
  };
  // Every rank's buffer is checked before anything is written.
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != mine.size()) {
      throw DecodeError(DecodeError::Reason::kMalformed,
                        detail::concat("dense path from rank ", r, " (iteration ", iteration,
                                       ") has ", all[r].size(), " bytes, expected ", mine.size(),
                                       " (", dense_flat.size(), " ", to_string(type), " values",
                                       auth != nullptr ? " and a tag" : "", ")"));
    }
    if (auth != nullptr && !auth->verify({tag_input(static_cast<int>(r)),
                                          std::span<const uint8_t>(all[r]).first(values_bytes)},
                                         std::span<const uint8_t>(all[r]).subspan(values_bytes))) {
      throw DecodeError(DecodeError::Reason::kBadTag,
                        detail::concat("dense path from rank ", r, " (iteration ", iteration,
                                       "): authentication tag does not verify (altered, replayed "
                                       "from another step or rank, or made without this job's "
                                       "secret); refused"));
    }
    for (size_t e = 0; e < dense_flat.size(); ++e) {
      if (!std::isfinite(value(all[r], e))) {
        throw DecodeError(DecodeError::Reason::kMalformed,
                          detail::concat("dense path from rank ", r, " (iteration ", iteration,
                                         "): value ", e, " is not finite"));
      }
    }
  }
  for (size_t e = 0; e < dense_flat.size(); ++e) {
    float sum = 0.0f;
    for (const auto& bytes : all) sum += value(bytes, e);
    dense_flat[e] = sum;
  }
  return auth != nullptr ? kTagBytes : 0;
}

}  // namespace dgc
