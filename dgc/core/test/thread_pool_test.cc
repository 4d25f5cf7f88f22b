// The core's thread pool (thread_pool.h).
#include "dgc/core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "dgc/core/error.h"

namespace dgc {
namespace {

TEST(ThreadPool, RunsEveryTaskOnceAcrossManyBatches) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t count : {0, 1, 2, 7, 100}) {
      for (int batch = 0; batch < 20; ++batch) {
        std::vector<std::atomic<int>> hits(count);
        pool.run(count, [&](size_t i) { hits[i].fetch_add(1); });
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << i;
      }
    }
  }
}

TEST(ThreadPool, RethrowsATaskExceptionAfterAllTasksFinish) {
  ThreadPool pool(4);
  std::atomic<int> done{0};
  EXPECT_THROW(pool.run(16,
                        [&](size_t i) {
                          done.fetch_add(1);
                          if (i == 5) throw NumericError("task 5");
                        }),
               NumericError);
  EXPECT_EQ(done.load(), 16);
  // The pool is still usable.
  std::atomic<int> again{0};
  pool.run(8, [&](size_t) { again.fetch_add(1); });
  EXPECT_EQ(again.load(), 8);
}

TEST(ThreadPool, RejectsZeroThreads) { EXPECT_THROW(ThreadPool(0), InvalidArgument); }

}  // namespace
}  // namespace dgc
