// tests/unit/notify_ring_test.cc — transport/notify_ring.h in one process:
// round trips of varied records that wrap the data area many times; the
// byte and credit limits; Close; the doorbell and the sleeping word; a
// hostile producer (the test scribbles a second mapping of the memfd) that
// the consumer must refuse with kBroken; a hostile consumer whose head the
// producer must refuse without writing; the files and doorbells Attach and
// the sizes Create refuse; a producer and a consumer thread (spinning, or
// asleep on the doorbell) carrying 100000 numbered records.
#include "transport/notify_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using hixl::StatusCode;
using hixl::net::Fd;
using hixl::transport::NotifyRing;
using Push = NotifyRing::PushResult;
using Pop = NotifyRing::PopResult;
using Clock = std::chrono::steady_clock;

#define HIXL_ASSERT_OK(expr)                                            \
  do {                                                                  \
    ::hixl::Status hixl_s_ = (expr);                                    \
    ASSERT_TRUE(hixl_s_.ok()) << #expr << " -> " << hixl_s_.ToString(); \
  } while (0)

// The shared layout, as notify_ring.cc defines it.
constexpr uint64_t kMagic = 0x31474e5254584948ull;
constexpr size_t kOffGeometry = 8, kOffTail = 64, kOffHead = 128, kOffCredit = 136,
                 kOffSleeping = 192, kOffClosed = 200, kHdr = NotifyRing::kHeaderBytes;
constexpr uint64_t kGeometry4K = (1ull << 32) | 4096;
constexpr unsigned kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

size_t RecBytes(size_t n, size_t m) { return (8 + n + m + 7) / 8 * 8; }

// n bytes that run through every value (0 and 0xff included) from `seed`.
std::string Bytes(size_t n, unsigned seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((seed + i * 7) & 0xff);
  return s;
}

// A consumer (Create) and a producer (Attach) of one ring; `fd` and `bell`
// are the test's own copies of the memfd and the doorbell's sending end.
struct Ring {
  std::unique_ptr<NotifyRing> cons, prod;
  Fd fd, bell;
};
void MakeRing(size_t data, uint64_t credit, Ring& r) {
  HIXL_ASSERT_OK(NotifyRing::Create(data, credit, r.cons, r.fd, r.bell));
  ASSERT_NE(r.cons, nullptr);
  ASSERT_TRUE(r.bell.valid());
  HIXL_ASSERT_OK(NotifyRing::Attach(Fd(dup(r.fd.get())), Fd(dup(r.bell.get())), r.prod));
  ASSERT_NE(r.prod, nullptr);
}

// Rings pending on the consumer's end of the doorbell (taken).
int Rings(const NotifyRing& cons) {
  int n = 0;
  char b[16];
  while (n < 1000 && recv(cons.bell_fd(), b, sizeof(b), MSG_DONTWAIT) > 0) ++n;
  return n;
}

// A second mapping of the memfd, as the other process sees it.
struct Shared {
  explicit Shared(int fd, size_t data) : len(kHdr + data) {
    p = static_cast<uint8_t*>(mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  }
  ~Shared() {
    if (p != MAP_FAILED) munmap(p, len);
  }
  uint64_t Get(size_t off) const {
    uint64_t v;
    std::memcpy(&v, p + off, 8);
    return v;
  }
  void Set(size_t off, uint64_t v) { std::memcpy(p + off, &v, 8); }
  // A record header at data offset `at` (no wrap: `at` is 8-aligned).
  void Rec(size_t at, uint32_t len, uint16_t nl, uint16_t ml) {
    std::memcpy(p + kHdr + at, &len, 4);
    std::memcpy(p + kHdr + at + 4, &nl, 2);
    std::memcpy(p + kHdr + at + 6, &ml, 2);
  }
  std::vector<uint8_t> Data() const { return {p + kHdr, p + len}; }
  uint8_t* p;
  size_t len;
};

TEST(NotifyRing, RoundTripOfVariedRecordsWrapsManyTimes) {
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, ~0ull, r));
  EXPECT_EQ(r.cons->data_bytes(), 4096u);
  EXPECT_EQ(r.prod->data_bytes(), 4096u);
  std::string name = "stale", msg = "stale";
  EXPECT_EQ(r.cons->Pop(name, msg), Pop::kEmpty);
  EXPECT_FALSE(r.cons->HasData());
  const std::pair<size_t, size_t> sizes[] = {
      {0, 0},    {1, 0},    {0, 1},    {1, 1},    {3, 5},   {7, 0},    {0, 9}, {1024, 1024},
      {17, 333}, {1023, 1}, {1024, 0}, {0, 1024}, {100, 7}, {1, 1024}, {8, 8}, {1024, 1023}};
  std::deque<std::pair<std::string, std::string>> want;
  size_t bytes = 0, popped = 0;
  auto pop_one = [&] {
    ASSERT_FALSE(want.empty());
    ASSERT_EQ(r.cons->Pop(name, msg), Pop::kGot) << "record " << popped;
    EXPECT_EQ(name, want.front().first) << "record " << popped;
    EXPECT_EQ(msg, want.front().second) << "record " << popped;
    want.pop_front();
    ++popped;
  };
  for (unsigned i = 0; i < 4000; ++i) {
    const auto [n, m] = sizes[i % std::size(sizes)];
    std::string a = Bytes(n, i), b = Bytes(m, i * 13 + 1);
    Push res = r.prod->Push(a, b);
    for (int tries = 0; res == Push::kFull && tries < 600; ++tries) {
      ASSERT_NO_FATAL_FAILURE(pop_one());
      res = r.prod->Push(a, b);
    }
    ASSERT_EQ(res, Push::kPosted) << "record " << i;
    bytes += RecBytes(n, m);
    want.emplace_back(std::move(a), std::move(b));
    if (i % 3 == 0) {
      ASSERT_NO_FATAL_FAILURE(pop_one());
    }
  }
  for (int k = 0; k < 4000 && !want.empty(); ++k) ASSERT_NO_FATAL_FAILURE(pop_one());
  EXPECT_EQ(popped, 4000u);
  EXPECT_GT(bytes / 4096, 200u) << "the records should wrap the data area many times";
  EXPECT_EQ(r.cons->Pop(name, msg), Pop::kEmpty);
  EXPECT_FALSE(r.cons->HasData());
}

// A default string_view has a null data(): no memcpy from it (UBSan).
TEST(NotifyRing, NullStringViewsAreEmptyRecords) {
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, 100, r));
  ASSERT_EQ(r.prod->Push(std::string_view(), std::string_view()), Push::kPosted);
  std::string name = "stale", msg = "stale";
  ASSERT_EQ(r.cons->Pop(name, msg), Pop::kGot);
  EXPECT_TRUE(name.empty() && msg.empty());
}

TEST(NotifyRing, FullByBytes) {
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, ~0ull, r));
  const std::string name(10, 'n'), msg(50, 'm');  // 8 + 60 -> 72 bytes
  ASSERT_EQ(RecBytes(10, 50), 72u);
  size_t fit = 0;
  while (fit < 1000 && r.prod->Push(name, msg) == Push::kPosted) ++fit;
  EXPECT_EQ(fit, 4096u / 72);  // 56 records, 64 bytes left
  EXPECT_EQ(r.prod->Push(name, msg), Push::kFull);
  // 64 bytes exactly: 8 + 56.
  EXPECT_EQ(r.prod->Push("", std::string(57, 'x')), Push::kFull);
  EXPECT_EQ(r.prod->Push("", std::string(56, 'x')), Push::kPosted);
  EXPECT_EQ(r.prod->Push("", ""), Push::kFull);  // not even a bare header
  // Records beyond the engine's limits never go in.
  std::string got_n, got_m;
  ASSERT_EQ(r.cons->Pop(got_n, got_m), Pop::kGot);
  EXPECT_EQ(got_n, name);
  EXPECT_NE(r.prod->Push(std::string(1025, 'n'), ""), Push::kPosted);
  EXPECT_NE(r.prod->Push("", std::string(1025, 'm')), Push::kPosted);
  EXPECT_EQ(r.prod->Push(name, msg), Push::kPosted);
  EXPECT_EQ(r.prod->Push("", ""), Push::kFull);
  size_t left = 0;
  while (left < 1000 && r.cons->Pop(got_n, got_m) == Pop::kGot) ++left;
  EXPECT_EQ(left, fit - 1 + 1 + 1);
}

TEST(NotifyRing, CreditCountsRecords) {
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, 2, r));
  EXPECT_EQ(r.prod->Push("a", "1"), Push::kPosted);
  EXPECT_EQ(r.prod->Push("a", "2"), Push::kPosted);
  EXPECT_EQ(r.prod->Push("a", "3"), Push::kFull);
  std::string n, m;
  // Popping frees bytes, not credit: the credit is a total.
  ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  EXPECT_EQ(r.prod->Push("a", "3"), Push::kFull);
  r.cons->SetCredit(3);
  EXPECT_EQ(r.prod->Push("a", "3"), Push::kPosted);
  EXPECT_EQ(r.prod->Push("a", "4"), Push::kFull);
  ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  EXPECT_EQ(m, "3");
  EXPECT_EQ(r.cons->Pop(n, m), Pop::kEmpty);
}

TEST(NotifyRing, CloseStopsThePushesButNotThePops) {
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, 100, r));
  for (const char* m : {"x", "y", "z"}) ASSERT_EQ(r.prod->Push("n", m), Push::kPosted);
  r.cons->Close();
  EXPECT_EQ(r.prod->Push("n", "w"), Push::kClosed);
  EXPECT_EQ(r.prod->Push("", ""), Push::kClosed);
  std::string n, m;
  for (const char* want : {"x", "y", "z"}) {
    ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
    EXPECT_EQ(m, want);
  }
  EXPECT_EQ(r.cons->Pop(n, m), Pop::kEmpty);
}

TEST(NotifyRing, DoorbellRingsOnlyForASleepingConsumer) {
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, 100, r));
  EXPECT_FALSE(r.cons->SetSleeping(true));  // nothing waiting
  ASSERT_EQ(r.prod->Push("a", "1"), Push::kPosted);
  EXPECT_EQ(Rings(*r.cons), 1);
  EXPECT_TRUE(r.cons->HasData());
  EXPECT_TRUE(r.cons->SetSleeping(false));  // a record is waiting
  ASSERT_EQ(r.prod->Push("a", "2"), Push::kPosted);
  EXPECT_EQ(Rings(*r.cons), 0);
  std::string n, m;
  ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  EXPECT_TRUE(r.cons->HasData());
  ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  EXPECT_FALSE(r.cons->HasData());
  EXPECT_FALSE(r.cons->SetSleeping(true));
  EXPECT_FALSE(r.cons->SetSleeping(false));
}

// The test writes the producer's words and records itself.
TEST(NotifyRing, ConsumerRefusesAHostileProducer) {
  struct Case {
    const char* what;
    uint32_t len;  // the record header written at offset 0
    uint16_t name_len, msg_len;
    uint64_t tail;
  };
  const Case cases[] = {
      {"tail far beyond", 16, 3, 5, 1ull << 40},
      {"tail just beyond capacity", 16, 3, 5, 4096 + 8},
      {"tail at the very top", 16, 3, 5, ~0ull},
      {"length above the strings", 24, 1, 1, 24},
      {"length below the strings", 8, 4, 4, 16},
      {"zero length", 0, 0, 0, 8},
      {"name_len 1025", 1040, 1025, 0, 1040},
      {"msg_len 1025", 1040, 0, 1025, 1040},
      {"name_len 0xffff", 65544, 0xffff, 0, 4096},
      {"length beyond the published bytes", 2056, 1024, 1024, 1024},
      {"only the header published", 16, 3, 5, 8},
      {"partial header", 8, 0, 0, 4},
  };
  for (const Case& c : cases) {
    std::unique_ptr<NotifyRing> cons;
    Fd fd, bell;
    HIXL_ASSERT_OK(NotifyRing::Create(4096, 100, cons, fd, bell));
    Shared s(fd.get(), 4096);
    ASSERT_NE(s.p, MAP_FAILED);
    s.Rec(0, c.len, c.name_len, c.msg_len);
    s.Set(kOffTail, c.tail);
    std::string n, m;
    EXPECT_EQ(cons->Pop(n, m), Pop::kBroken) << c.what;
    EXPECT_EQ(cons->Pop(n, m), Pop::kBroken) << c.what << ", again";
    EXPECT_EQ(s.Get(kOffHead), 0u) << c.what << ": the head must not move";
    EXPECT_TRUE(cons->HasData()) << c.what;
  }
  // A record written by hand is taken (the layout above is right); then a
  // tail below the head is refused.
  std::unique_ptr<NotifyRing> cons;
  Fd fd, bell;
  HIXL_ASSERT_OK(NotifyRing::Create(4096, 100, cons, fd, bell));
  Shared s(fd.get(), 4096);
  ASSERT_NE(s.p, MAP_FAILED);
  s.Rec(0, 16, 3, 5);
  std::memcpy(s.p + kHdr + 8, "abchello", 8);
  s.Set(kOffTail, 16);
  std::string n, m;
  ASSERT_EQ(cons->Pop(n, m), Pop::kGot);
  EXPECT_EQ(n, "abc");
  EXPECT_EQ(m, "hello");
  EXPECT_EQ(s.Get(kOffHead), 16u);
  s.Set(kOffTail, 8);
  EXPECT_EQ(cons->Pop(n, m), Pop::kBroken) << "tail < head";
  EXPECT_EQ(s.Get(kOffHead), 16u);
  s.Set(kOffTail, 16);
  EXPECT_EQ(cons->Pop(n, m), Pop::kEmpty);
}

// The test writes the consumer's head; the producer must write nothing.
TEST(NotifyRing, ProducerRefusesAHostileConsumer) {
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, ~0ull, r));
  Shared s(r.fd.get(), 4096);
  ASSERT_NE(s.p, MAP_FAILED);
  const std::string big(1024, 'b');
  std::string n, m;
  // Three 2056-byte records through: the producer's tail is 6168.
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(r.prod->Push(big, big), Push::kPosted);
    ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  }
  ASSERT_EQ(r.prod->Push("abc", "hello"), Push::kPosted);
  const uint64_t tail = s.Get(kOffTail);
  ASSERT_EQ(tail, 3 * 2056u + 16);
  const std::vector<uint8_t> before = s.Data();
  for (uint64_t head :
       std::initializer_list<uint64_t>{tail + 1, tail + 8, uint64_t{1} << 40, ~0ull, uint64_t{0},
                                       tail - 4096 - 8, tail - 4096 - 1}) {
    s.Set(kOffHead, head);
    EXPECT_EQ(r.prod->Push("x", "y"), Push::kBroken) << "head " << head << ", tail " << tail;
    EXPECT_EQ(r.prod->Push("", ""), Push::kBroken) << "head " << head;
    EXPECT_EQ(s.Get(kOffTail), tail);
    EXPECT_TRUE(s.Data() == before) << "head " << head << ": the data area changed";
  }
  // A head exactly a capacity behind: full, not broken.
  s.Set(kOffHead, tail - 4096);
  EXPECT_EQ(r.prod->Push("", ""), Push::kFull);
  EXPECT_TRUE(s.Data() == before);
  // The true head again: the ring works.
  s.Set(kOffHead, 3 * 2056u);
  EXPECT_EQ(r.prod->Push("x", "y"), Push::kPosted);
  ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  EXPECT_EQ(n + m, "abchello");
  ASSERT_EQ(r.cons->Pop(n, m), Pop::kGot);
  EXPECT_EQ(n + m, "xy");
  s.Set(kOffClosed, 7);  // any non-zero word closes
  EXPECT_EQ(r.prod->Push("x", "y"), Push::kClosed);
}

// A ring file made by hand: `len` bytes, a header, and seals.
Fd Craft(size_t len, uint64_t magic, uint64_t geometry, unsigned seals, uint64_t head = 0) {
  Fd f(memfd_create("notify-ring-test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  EXPECT_TRUE(f.valid());
  EXPECT_EQ(ftruncate(f.get(), static_cast<off_t>(len)), 0);
  if (len >= 16) {
    EXPECT_EQ(pwrite(f.get(), &magic, 8, 0), 8);
    EXPECT_EQ(pwrite(f.get(), &geometry, 8, kOffGeometry), 8);
  }
  if (len >= kOffHead + 8) {
    EXPECT_EQ(pwrite(f.get(), &head, 8, kOffHead), 8);
  }
  if (seals != 0) {
    EXPECT_EQ(fcntl(f.get(), F_ADD_SEALS, seals), 0);
  }
  return f;
}
Fd Bell() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, sv) != 0) return Fd();
  close(sv[0]);
  return Fd(sv[1]);
}

TEST(NotifyRing, AttachRefusesBadFilesAndDoorbells) {
  std::unique_ptr<NotifyRing> p;
  // The control: a well-made file attaches.
  HIXL_ASSERT_OK(NotifyRing::Attach(Craft(kHdr + 4096, kMagic, kGeometry4K, kSeals), Bell(), p));
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->data_bytes(), 4096u);
  EXPECT_EQ(p->Push("n", "m"), Push::kFull);  // its credit word is 0
  struct Case {
    const char* what;
    Fd ring;
  };
  Case cases[] = {
      {"unsealed", Craft(kHdr + 4096, kMagic, kGeometry4K, 0)},
      {"may shrink", Craft(kHdr + 4096, kMagic, kGeometry4K, F_SEAL_GROW | F_SEAL_SEAL)},
      {"wrong magic", Craft(kHdr + 4096, kMagic ^ 1, kGeometry4K, kSeals)},
      {"wrong version", Craft(kHdr + 4096, kMagic, (2ull << 32) | 4096, kSeals)},
      {"not a power of two", Craft(kHdr + 8192, kMagic, (1ull << 32) | 6144, kSeals)},
      {"below the minimum", Craft(kHdr + 4096, kMagic, (1ull << 32) | 2048, kSeals)},
      {"above the maximum", Craft(kHdr + 4096, kMagic, (1ull << 32) | (32u << 20), kSeals)},
      {"zero geometry", Craft(kHdr + 4096, kMagic, 0, kSeals)},
      {"too short", Craft(kHdr + 2048, kMagic, (1ull << 32) | 2048, kSeals)},
      {"shorter than one page", Craft(100, kMagic, kGeometry4K, kSeals)},
      {"empty", Craft(0, 0, 0, kSeals)},
      {"geometry beyond the file", Craft(kHdr + 4096, kMagic, (1ull << 32) | 8192, kSeals)},
      {"16 MiB named, 4 KiB there", Craft(kHdr + 4096, kMagic, (1ull << 32) | (16u << 20), kSeals)},
      {"not fresh", Craft(kHdr + 4096, kMagic, kGeometry4K, kSeals, 8)},
      {"not a file", Fd(eventfd(0, EFD_CLOEXEC))},
      {"no descriptor", Fd()},
  };
  for (Case& c : cases) {
    p.reset();
    EXPECT_FALSE(NotifyRing::Attach(std::move(c.ring), Bell(), p).ok()) << c.what;
    EXPECT_EQ(p, nullptr) << c.what;
  }
  int pfd[2];
  ASSERT_EQ(pipe2(pfd, O_CLOEXEC), 0);
  Fd rd(pfd[0]), wr(pfd[1]);
  int sp[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
  Fd stream(sp[0]), stream_peer(sp[1]);
  Fd bells[] = {std::move(wr), Fd(), Craft(kHdr + 4096, kMagic, kGeometry4K, kSeals),
                Fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)), std::move(stream)};
  for (Fd& b : bells) {
    p.reset();
    EXPECT_FALSE(
        NotifyRing::Attach(Craft(kHdr + 4096, kMagic, kGeometry4K, kSeals), std::move(b), p).ok());
    EXPECT_EQ(p, nullptr);
  }
}

TEST(NotifyRing, CreateChecksTheSizeAndSealsTheFile) {
  for (size_t bad : {size_t{0}, size_t{1}, size_t{2048}, size_t{4095}, size_t{4097}, size_t{6144},
                     size_t{(16u << 20) + 4096}, size_t{32u << 20}, size_t{1} << 40, ~size_t{0}}) {
    std::unique_ptr<NotifyRing> c;
    Fd fd, bell;
    const hixl::Status s = NotifyRing::Create(bad, 1, c, fd, bell);
    EXPECT_EQ(s.code(), StatusCode::kParamInvalid) << bad;
    EXPECT_EQ(c, nullptr) << bad;
    EXPECT_FALSE(fd.valid()) << bad;
    EXPECT_FALSE(bell.valid()) << bad;
  }
  for (size_t good : {size_t{4096}, size_t{65536}, size_t{16u << 20}}) {
    std::unique_ptr<NotifyRing> c;
    Fd fd, bell;
    HIXL_ASSERT_OK(NotifyRing::Create(good, 1, c, fd, bell));
    EXPECT_EQ(c->data_bytes(), good);
    EXPECT_EQ(lseek(fd.get(), 0, SEEK_END), static_cast<off_t>(kHdr + good));
    EXPECT_EQ(fcntl(fd.get(), F_GET_SEALS) & kSeals, static_cast<int>(kSeals));
    Shared s(fd.get(), good);
    ASSERT_NE(s.p, MAP_FAILED);
    EXPECT_EQ(s.Get(0), kMagic);
    EXPECT_EQ(s.Get(kOffGeometry), (1ull << 32) | good);
    EXPECT_EQ(s.Get(kOffCredit), 1u);
    for (size_t off : {kOffTail, kOffHead, kOffSleeping, kOffClosed}) EXPECT_EQ(s.Get(off), 0u);
  }
}

// `producers` threads push 100000 numbered records in all; the consumer
// checks each producer's order and raises the credit as it takes records.
// sleep: the consumer sleeps on the doorbell whenever the ring is empty.
void RunConcurrent(int producers, bool sleep) {
  constexpr uint64_t kTotal = 100000, kWindow = 64;
  const uint64_t per = kTotal / producers;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  Ring r;
  ASSERT_NO_FATAL_FAILURE(MakeRing(4096, kWindow, r));
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int id = 0; id < producers; ++id) {
    threads.emplace_back([&, id] {
      const std::string name = "p" + std::to_string(id);
      for (uint64_t seq = 0; seq < per && !stop.load(); ++seq) {
        std::string msg(8 + seq % 37, static_cast<char>(seq));
        std::memcpy(msg.data(), &seq, 8);
        Push res = r.prod->Push(name, msg);
        for (long spins = 0; res == Push::kFull && spins < 20'000'000 && !stop.load(); ++spins) {
          if (Clock::now() > deadline) break;
          std::this_thread::yield();
          res = r.prod->Push(name, msg);
        }
        if (res != Push::kPosted) {
          ADD_FAILURE() << name << " record " << seq << ": " << static_cast<int>(res);
          stop = true;
        }
      }
    });
  }
  std::vector<uint64_t> next(producers, 0);
  uint64_t got = 0, timeouts = 0;
  std::string n, m;
  for (long iter = 0; got < kTotal && !stop.load() && iter < 100'000'000; ++iter) {
    if (Clock::now() > deadline) {
      ADD_FAILURE() << "timed out after " << got << " records";
      break;
    }
    const Pop res = r.cons->Pop(n, m);
    if (res == Pop::kBroken) {
      ADD_FAILURE() << "kBroken after " << got;
      break;
    }
    if (res == Pop::kEmpty) {
      if (!sleep) {
        std::this_thread::yield();
      } else if (!r.cons->SetSleeping(true)) {
        pollfd pfd{r.cons->bell_fd(), POLLIN, 0};
        if (poll(&pfd, 1, 5000) == 0) ++timeouts;  // a record left unseen
        r.cons->DrainBell();
        r.cons->SetSleeping(false);
      } else {
        r.cons->SetSleeping(false);
      }
      continue;
    }
    const int id = n.size() > 1 ? n[1] - '0' : -1;
    uint64_t seq = ~0ull;
    if (m.size() >= 8) std::memcpy(&seq, m.data(), 8);
    if (id < 0 || id >= producers || seq != next[id] || m.size() != 8 + seq % 37 ||
        m.find_first_not_of(static_cast<char>(seq), 8) != std::string::npos) {
      ADD_FAILURE() << "record " << got << ": name " << n << ", size " << m.size() << ", seq "
                    << seq;
      break;
    }
    ++next[id];
    r.cons->SetCredit(++got + kWindow);
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(got, kTotal);
  EXPECT_EQ(timeouts, 0u) << "the consumer slept through published records";
  EXPECT_EQ(r.cons->Pop(n, m), Pop::kEmpty);
}

TEST(NotifyRing, ConcurrentProducerAndSpinningConsumer) { RunConcurrent(1, false); }
TEST(NotifyRing, ConcurrentProducersAndSleepingConsumer) { RunConcurrent(2, true); }

// A consumer that does its worst to the doorbell — the shared socket made
// blocking and its buffer left full, or its receiving end shut — cannot make
// a Push block or fail.
TEST(NotifyRing, PushNeverBlocksOnAHostileDoorbell) {
  for (bool shut : {false, true}) {
    Ring r;
    ASSERT_NO_FATAL_FAILURE(MakeRing(1 << 20, ~0ull, r));
    r.cons->SetSleeping(true);
    ASSERT_EQ(fcntl(r.bell.get(), F_SETFL, 0), 0);  // the sending end, now blocking
    if (shut) {
      ASSERT_EQ(shutdown(r.cons->bell_fd(), SHUT_RDWR), 0);
    }
    std::atomic<int> posted{0};
    // Far more rings than the socket buffer holds; nobody takes them.
    std::thread t([&] {
      for (int i = 0; i < 5000; ++i) {
        if (r.prod->Push("n", "m") == Push::kPosted) ++posted;
      }
    });
    for (int i = 0; i < 500 && posted.load() < 5000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    EXPECT_EQ(posted.load(), 5000)
        << (shut ? "receiving end shut" : "buffer full") << ": Push blocked";
    // A blocked Push would go on once rings are taken: the thread ends either way.
    for (int i = 0; i < 100 && posted.load() < 5000; ++i) {
      r.cons->DrainBell();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    t.join();
  }
}

}  // namespace
