// Private to the trainer's files: trainer.cc (the run), trainer_checkpoints.cc (writing
// checkpoints and choosing the one to resume from) and resume.cc (--resume auto, elastic
// restarts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dgc/train/trainer.h"

namespace dgc::train {

struct Trainer::EpochProgress {
  double loss_sum = 0.0;       // this rank's batch losses so far in the epoch
  ExchangeBytes bytes_before;  // the run's byte counters when the epoch began
  double train_seconds = 0.0;  // the epoch's training steps so far
  double exchange_seconds = 0.0;
  double exchange_seconds_max =
      0.0;                    // the slowest exchange of the epoch since this process began it
  int64_t skipped_steps = 0;  // skipped in the epoch so far (their losses are not in loss_sum)
};

namespace trainer_detail {

// Every rank's `mine`, in rank order (collective).
std::vector<std::string> allgather_text(comm::Communicator& comm, const std::string& mine,
                                        comm::Timeout timeout);
std::string steps_text(const std::vector<int64_t>& steps);
std::vector<int64_t> parse_steps(const std::string& text);
bool contains(const std::vector<int64_t>& steps, int64_t step);
// "rank 0: step 120, rank 1: step 100"
std::string per_rank_text(const std::vector<std::string>& values, const std::string& what);

}  // namespace trainer_detail
}  // namespace dgc::train
