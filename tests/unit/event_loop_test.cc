// EventLoop's stall watch: the count a handler compares before it acts on
// what it read moves after the loop thread could not run for longer than the
// bound, wherever the stall fell (a wait, a handler, between handlers), and
// stays put while the loop runs normally. The stop cases use a real child
// process stopped with SIGSTOP, as the tcp target's fence must survive.
#include "common/event_loop.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <thread>

namespace hixl {
namespace {

using std::chrono::milliseconds;

// Runs fn on the loop thread and returns its result.
uint64_t OnLoop(EventLoop& loop, std::function<uint64_t()> fn) {
  std::promise<uint64_t> p;
  auto f = p.get_future();
  EXPECT_TRUE(loop.Post([&] { p.set_value(fn()); }));
  EXPECT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  return f.get();
}

TEST(EventLoopStall, QuietLoopCountsNothing) {
  EventLoop loop;
  loop.SetStallBound(milliseconds(1000));
  loop.SetTicker([] {}, 10);
  ASSERT_TRUE(loop.Start("stall-quiet").ok());
  const uint64_t c0 = OnLoop(loop, [&] { return loop.Checkpoint(); });
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(milliseconds(15));
    EXPECT_EQ(OnLoop(loop, [&] { return loop.Checkpoint(); }), c0);
  }
  loop.Stop();
}

TEST(EventLoopStall, GapBetweenCheckpointsCounts) {
  EventLoop loop;
  loop.SetStallBound(milliseconds(50));
  ASSERT_TRUE(loop.Start("stall-gap").ok());
  const uint64_t after = OnLoop(loop, [&] {
    const uint64_t c0 = loop.Checkpoint();
    std::this_thread::sleep_for(milliseconds(150));  // starved, as far as the watch can tell
    return loop.Checkpoint() - c0;
  });
  EXPECT_EQ(after, 1u);
  loop.Stop();
}

// A handler that started before another one stalled sees the count moved,
// though its own next checkpoint follows the other's at once.
TEST(EventLoopStall, StallSeenByAnotherHandlerMovesTheCount) {
  EventLoop loop;
  loop.SetStallBound(milliseconds(50));
  ASSERT_TRUE(loop.Start("stall-other").ok());
  std::promise<uint64_t> seen;
  auto f = seen.get_future();
  ASSERT_TRUE(loop.Post([&] {
    const uint64_t mine = loop.Checkpoint();
    loop.Post([&, mine] {  // another handler stalls, and checkpoints after it
      std::this_thread::sleep_for(milliseconds(150));
      loop.Checkpoint();
      loop.Post([&, mine] { seen.set_value(loop.Checkpoint() - mine); });
    });
  }));
  ASSERT_EQ(f.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(f.get(), 1u);
  loop.Stop();
}

// Time spent outside any checkpoint (here the ticker) counts at the next
// wake, before its handlers run.
TEST(EventLoopStall, StallOutsideHandlersCountsAtTheNextWake) {
  EventLoop loop;
  loop.SetStallBound(milliseconds(50));
  std::atomic<int> ticks{0};
  loop.SetTicker(
      [&] {
        if (ticks++ == 1) std::this_thread::sleep_for(milliseconds(200));
      },
      20);
  ASSERT_TRUE(loop.Start("stall-tick").ok());
  const uint64_t c0 = OnLoop(loop, [&] { return loop.stalls(); });
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ticks.load() < 3 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(10));
  ASSERT_GE(ticks.load(), 3);
  EXPECT_EQ(OnLoop(loop, [&] { return loop.stalls(); }) - c0, 1u);
  loop.Stop();
}

TEST(EventLoopStall, BoundZeroIsOff) {
  EventLoop loop;
  ASSERT_TRUE(loop.Start("stall-off").ok());
  EXPECT_EQ(OnLoop(loop,
                   [&] {
                     loop.Checkpoint();
                     std::this_thread::sleep_for(milliseconds(100));
                     return loop.Checkpoint();
                   }),
            0u);
  loop.Stop();
}

// A child process runs a loop; the parent stops it with SIGSTOP for longer
// than the bound, either while the loop waits or while a handler runs
// (checkpointing between steps), and the child reports through a pipe how
// far the count moved.
enum class StopWhere { kWaiting, kInHandler };

uint64_t StallsAcrossAStop(StopWhere where) {
  int go[2], report[2];
  if (pipe(go) != 0 || pipe(report) != 0) return ~0ull;
  const pid_t pid = fork();
  if (pid == 0) {
    close(go[1]);
    close(report[0]);
    uint64_t moved = ~0ull;
    {
      EventLoop loop;
      loop.SetStallBound(milliseconds(100));
      if (!loop.Start("stall-child").ok()) _exit(2);
      std::promise<void> done;
      loop.Post([&] {
        const uint64_t c0 = loop.Checkpoint();
        if (where == StopWhere::kInHandler) {
          // Steps for up to 3 s, each a checkpoint, until the parent's byte
          // says the stop is over.
          char b = 1;
          if (write(report[1], &b, 1) != 1) _exit(3);  // "running"
          const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
          while (std::chrono::steady_clock::now() < end) {
            loop.Checkpoint();
            pollfd p{go[0], POLLIN, 0};
            if (poll(&p, 1, 0) == 1) break;
          }
          moved = loop.Checkpoint() - c0;
          done.set_value();
          return;
        }
        char b = 1;
        if (write(report[1], &b, 1) != 1) _exit(3);
        loop.Add(go[0], EPOLLIN, [&, c0](uint32_t) {
          if (moved == ~0ull) {
            moved = loop.Checkpoint() - c0;
            done.set_value();
          }
        });
      });
      done.get_future().wait();
      loop.Stop();
    }
    _exit(write(report[1], &moved, sizeof(moved)) == sizeof(moved) ? 0 : 4);
  }
  close(go[0]);
  close(report[1]);
  uint64_t moved = ~0ull;
  char b;
  if (read(report[0], &b, 1) == 1) {
    std::this_thread::sleep_for(milliseconds(50));  // waiting, or inside its steps
    kill(pid, SIGSTOP);
    std::this_thread::sleep_for(milliseconds(400));
    kill(pid, SIGCONT);
    std::this_thread::sleep_for(milliseconds(50));
    b = 1;
    if (write(go[1], &b, 1) == 1 && read(report[0], &moved, sizeof(moved)) != sizeof(moved))
      moved = ~0ull;
  }
  close(go[1]);
  close(report[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "child status " << st;
  return moved;
}

TEST(EventLoopStall, StopWhileWaitingCounts) {
  EXPECT_EQ(StallsAcrossAStop(StopWhere::kWaiting), 1u);
}

TEST(EventLoopStall, StopInsideAHandlerCounts) {
  EXPECT_EQ(StallsAcrossAStop(StopWhere::kInHandler), 1u);
}

}  // namespace
}  // namespace hixl
