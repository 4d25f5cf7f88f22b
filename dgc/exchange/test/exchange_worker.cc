// A rank of a multi-process exchange test (connection as in dgc/comm/test/worker_common.h).
//
//   exchange_worker run --iterations K [--exchange A] [--mismatch-rank R]
//                       [--mismatch-exchange-rank R] [--timeout-ms T] ...
// Broadcasts parameters from rank 0, runs the handshake and K exchange iterations on the test
// layout with exchange algorithm A (0 allgather, 1 direct, 2 sparse-allreduce; default 0), and
// checks every iteration against the reference (reference.h). Prints "rank r iteration i" after
// each (the killed-peer tests wait for it). Rank R of --mismatch-rank builds fc.weight with
// another shape, rank R of --mismatch-exchange-rank uses the next algorithm (the handshake must
// stop every rank). With DGC_JOB_SECRET set, rendezvous and messages are authenticated.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "dgc/comm/test/worker_common.h"
#include "dgc/exchange/exchange.h"
#include "dgc/exchange/test/exchange_fixture.h"

namespace {

int run(dgc::comm::Communicator& comm, const std::map<std::string, std::string>& args) {
  auto get = [&](const char* name, int fallback) {
    auto it = args.find(name);
    return it == args.end() ? fallback : std::stoi(it->second);
  };
  const int iterations = get("--iterations", 3);
  const int mismatch_rank = get("--mismatch-rank", -1);
  const int mismatch_exchange_rank = get("--mismatch-exchange-rank", -1);
  const int algorithm =
      (get("--exchange", 0) + (comm.rank() == mismatch_exchange_rank ? 1 : 0)) % 3;
  const int r = comm.rank();
  const int n = comm.size();
  const auto layout = dgc::test::model_layout(r == mismatch_rank ? 301 : 300);

  // Parameters start from rank 0's.
  std::vector<float> weights(64, static_cast<float>(r + 1));
  std::vector<std::span<float>> params = {weights};
  dgc::broadcast_parameters(comm, params, comm.default_timeout());
  for (float w : weights) {
    if (w != 1.0f) {
      std::fprintf(stderr, "rank %d: broadcast_parameters gave %g, expected 1\n", r, w);
      return dgc::test::kExitCheckFailed;
    }
  }

  dgc::ExchangeOptions options;
  options.timeout = comm.default_timeout();
  options.settings = "density=0.001\nmomentum=0.9\n";
  options.algorithm = static_cast<dgc::ExchangeAlgorithm>(algorithm);
  if (const auto keys = dgc::test::job_keys_from_env()) options.message_key = keys->exchange;
  dgc::Exchange exchange(comm, layout, options);
  std::vector<std::vector<float>> updates;
  for (size_t c : exchange.compressed_tensors()) updates.emplace_back(layout[c].numel());
  const auto spans = dgc::test::spans(updates);
  std::vector<dgc::Selection> unapplied(updates.size());
  double worst = 0.0;
  int64_t problems = 0;
  std::string first;
  for (int it = 0; it < iterations; ++it) {
    auto in = dgc::test::rank_inputs(layout, r, it);
    if (exchange.run(it, in.selections, spans, in.dense, true, unapplied) != 0) {
      std::fprintf(stderr, "rank %d: a rank flagged a bad gradient\n", r);
      return dgc::test::kExitCheckFailed;
    }
    problems += dgc::test::check_against_reference(comm, layout, it, dgc::test::Pattern::kColliding,
                                                   unapplied, updates, options.value_type, first);
    const auto expected = dgc::test::expected_result(layout, n, it);
    for (size_t j = 0; j < expected.dense.size(); ++j) {
      worst = std::max(worst, std::abs(in.dense[j] - expected.dense[j]));
    }
    std::printf("rank %d iteration %d\n", r, it);
    std::fflush(stdout);
  }
  if (problems > 0) {
    std::fprintf(stderr, "rank %d: %lld problem(s) against the reference, the first: %s\n", r,
                 static_cast<long long>(problems), first.c_str());
    worst = 1.0;
  }
  const auto& total = exchange.total();
  std::printf(
      "rank %d of %d (%s, %s%s): exchange %s (max error %.3g); per rank and iteration: message "
      "%llu B, "
      "dense gradient %llu B, wire sent %llu B, dense allreduce would send %llu B\n",
      r, n, comm.backend().c_str(), dgc::to_string(exchange.algorithm()),
      exchange.authenticated() ? ", authenticated" : "", worst <= 1e-6 ? "ok" : "WRONG", worst,
      static_cast<unsigned long long>(total.message / iterations),
      static_cast<unsigned long long>(total.dense_gradient / iterations),
      static_cast<unsigned long long>(total.wire_sent / iterations),
      static_cast<unsigned long long>(total.dense_wire_sent / iterations));
  return worst <= 1e-6 ? dgc::test::kExitOk : dgc::test::kExitCheckFailed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) != "run") {
    std::fprintf(stderr, "usage: exchange_worker run [--name value]...\n");
    return dgc::test::kExitOtherError;
  }
  const auto args = dgc::test::parse_args(argc, argv, 2);
  return dgc::test::run_worker([&] {
    auto comm = dgc::test::connect_worker(args);
    return run(*comm, args);
  });
}
