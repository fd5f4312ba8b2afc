// The job's store: the chief's TCP store (server and clients in this process) and the file store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster/net/socket.hpp"
#include "cluster/process_harness.hpp"
#include "cluster/store/tcp_store.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {
namespace {

using ::testing::HasSubstr;
using Role = TcpStoreClient::Role;

std::vector<std::string> names(int n) {
  std::vector<std::string> out;
  for (int w = 0; w < n; ++w) out.push_back("worker " + std::to_string(w) + " (test)");
  return out;
}

TEST(TcpStore, SetGetWaitAndSetIfAbsent) {
  StoreServer server("127.0.0.1", 0, "job", names(2));
  TcpStoreClient a("127.0.0.1", server.port(), "job", 0, Role::request, 5);
  TcpStoreClient b("127.0.0.1", server.port(), "job", 1, Role::request, 5);
  EXPECT_EQ(a.generation(), server.generation());
  EXPECT_EQ(a.generation().size(), 16u);
  a.set("k", std::string("v\0w", 3));
  EXPECT_EQ(b.get("k", 1), std::string("v\0w", 3));
  EXPECT_EQ(b.get("absent", 0.05), std::nullopt);
  EXPECT_TRUE(a.set_if_absent("first", "a"));
  EXPECT_FALSE(b.set_if_absent("first", "b"));
  EXPECT_EQ(b.get("first", 0), "a");
  EXPECT_EQ(b.wait({"k", "x", "y"}, 0.05), (std::vector<std::string>{"x", "y"}));
  // A blocked get is answered as soon as another client sets the key.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    a.set("late", "here");
  });
  EXPECT_EQ(b.get("late", 30), "here");
  setter.join();
  EXPECT_TRUE(b.wait({"k", "late"}, 0).empty());
}

TEST(TcpStore, ClientsRetryUntilTheServerStarts) {
  const int port = testing::free_port();
  std::unique_ptr<StoreServer> server;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    server = std::make_unique<StoreServer>("127.0.0.1", port, "job", names(1));
  });
  TcpStoreClient c("127.0.0.1", port, "job", 0, Role::request, 10);
  later.join();
  c.set("a", "b");
  EXPECT_EQ(c.get("a", 0), "b");
}

TEST(TcpStore, ConnectingGivesUpAtTheDeadline) {
  const int port = testing::free_port();  // nobody listens
  const auto start = std::chrono::steady_clock::now();
  try {
    TcpStoreClient c("127.0.0.1", port, "job", 0, Role::request, 0.3);
    FAIL() << "connected to nothing";
  } catch (const DeadlineExceededError& e) {
    EXPECT_THAT(e.what(), HasSubstr("could not connect to the chief's store at 127.0.0.1"));
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10.0);
}

TEST(TcpStore, ARequestToAStoreThatNeverAnswersEndsAtItsDeadline) {
  // A listening socket nobody serves: connect succeeds, the introduction is never answered.
  net::Fd silent = net::listen_on("127.0.0.1", 0);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(silent.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  EXPECT_THROW(TcpStoreClient("127.0.0.1", port, "job", 0, Role::request, 0.2), DeadlineExceededError);
}

TEST(TcpStore, AnotherJobsWorkerIsRefused) {
  StoreServer server("127.0.0.1", 0, "job-a", names(2));
  try {
    TcpStoreClient c("127.0.0.1", server.port(), "job-b", 0, Role::request, 5);
    FAIL() << "accepted";
  } catch (const FailedPreconditionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("serves job 'job-a', not 'job-b'"));
  }
  EXPECT_THROW(TcpStoreClient("127.0.0.1", server.port(), "job-a", 2, Role::request, 5), FailedPreconditionError);
}

TEST(TcpStore, AMonitorConnectionClosingWithoutGoodbyePublishesTheWorkersDeath) {
  StoreServer server("127.0.0.1", 0, "job", names(3));
  const std::string prefix = "job/" + server.generation() + "/";
  TcpStoreClient watcher("127.0.0.1", server.port(), "job", 0, Role::request, 5);
  auto monitor2 = std::make_unique<TcpStoreClient>("127.0.0.1", server.port(), "job", 2, Role::monitor, 5);
  auto monitor1 = std::make_unique<TcpStoreClient>("127.0.0.1", server.port(), "job", 1, Role::monitor, 5);
  monitor1->bye(4);  // a goodbye first: its closing is no failure
  monitor1.reset();
  EXPECT_EQ(watcher.get(failure_key(prefix), 0.2), std::nullopt);
  EXPECT_EQ(watcher.departed(1), (std::vector<std::pair<int, int64_t>>{{1, 4}}));
  monitor2.reset();  // as if the process died
  const auto failure = watcher.get(failure_key(prefix), 10);
  ASSERT_TRUE(failure);
  const FailureNotice n = decode_failure(*failure);
  EXPECT_EQ(n.code, static_cast<int>(ErrorCode::UNAVAILABLE));
  EXPECT_THAT(n.message, HasSubstr("worker 2 (test) is gone"));
}

TEST(TcpStore, WaitAllGoneAndStaleWorkers) {
  StoreServer server("127.0.0.1", 0, "job", names(2));
  TcpStoreClient a("127.0.0.1", server.port(), "job", 0, Role::request, 5);
  TcpStoreClient m("127.0.0.1", server.port(), "job", 1, Role::monitor, 5);
  EXPECT_FALSE(a.wait_all_gone(0.05));
  // Neither has polled for a while: both count as stale; a fresh poll clears worker 1.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  m.get("nothing", 0);
  EXPECT_EQ(a.stale_workers(0.1, 1), (std::vector<int>{0}));
  a.bye(0);
  m.bye(0);
  EXPECT_TRUE(a.wait_all_gone(5));
}

TEST(TcpStore, MalformedAndOversizedFramesCloseOnlyThatConnection) {
  StoreServer server("127.0.0.1", 0, "job", names(1));
  for (const std::string& junk : {std::string("\x05\x00\x00\x00\x63hello", 9), std::string("\xff\xff\xff\x7f", 4),
                                  std::string("\x01\x00\x00\x00\x02", 5)}) {
    net::Fd fd = net::connect_until("127.0.0.1", server.port(), net::deadline_after(5), "store");
    net::send_all(fd.get(), junk.data(), junk.size(), net::deadline_after(5), "store");
    char c;
    EXPECT_THROW(net::recv_all(fd.get(), &c, 1, net::deadline_after(5), "store"), UnavailableError);
  }
  TcpStoreClient ok("127.0.0.1", server.port(), "job", 0, Role::request, 5);
  ok.set("still", "serving");
  EXPECT_EQ(ok.get("still", 0), "serving");
}

// Writing to a connection the peer closed is an error, never a SIGPIPE that kills the process.
TEST(TcpStore, WritingToAClosedConnectionRaisesInsteadOfKilling) {
  net::Fd listener = net::listen_on("127.0.0.1", 0);
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  net::Fd client = net::connect_until("127.0.0.1", port, net::deadline_after(5), "peer");
  for (int i = 0; i < 100; ++i) {
    net::Fd accepted(::accept(listener.get(), nullptr, nullptr));
    if (accepted) break;  // closed at once: the peer goes away
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string chunk(1 << 16, 'x');
  bool raised = false;
  for (int i = 0; i < 1000 && !raised; ++i) {
    try {
      net::send_all(client.get(), chunk.data(), chunk.size(), net::deadline_after(5), "peer");
    } catch (const UnavailableError& e) {
      EXPECT_THAT(e.what(), HasSubstr("the connection to peer failed"));
      raised = true;
    }
  }
  EXPECT_TRUE(raised);
}

TEST(TcpStore, TheSecondServerOnAPortFailsWithUnavailable) {
  StoreServer first("127.0.0.1", 0, "job", names(1));
  try {
    StoreServer second("127.0.0.1", first.port(), "job", names(1));
    FAIL() << "bound twice";
  } catch (const UnavailableError& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot listen on 127.0.0.1"));
  }
}

TEST(Sockets, ANameThatResolvesToLoopbackOnlyIsBoundToEveryAddress) {
  EXPECT_TRUE(net::loopback_alias("node7", {"127.0.1.1"}));
  EXPECT_TRUE(net::loopback_alias("node7", {"127.0.1.1", "::1"}));
  // An address the other machines can reach, an address literal, "localhost", nothing resolved.
  EXPECT_FALSE(net::loopback_alias("node7", {"127.0.1.1", "10.0.0.7"}));
  EXPECT_FALSE(net::loopback_alias("127.0.0.1", {"127.0.0.1"}));
  EXPECT_FALSE(net::loopback_alias("::1", {"::1"}));
  EXPECT_FALSE(net::loopback_alias("localhost", {"127.0.0.1", "::1"}));
  EXPECT_FALSE(net::loopback_alias("node7", {}));
}

// The numeric address a socket is bound to.
std::string bound_address(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  char text[NI_MAXHOST] = {};
  ::getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
  return text;
}

TEST(Sockets, ThisMachinesNameForALoopbackAddressListensEverywhereAndALiteralOnlyThere) {
  EXPECT_EQ(bound_address(net::listen_on("127.0.0.1", 0).get()), "127.0.0.1");
  char name[256] = {};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, "0", &hints, &found) != 0)
    GTEST_SKIP() << "this machine's name '" << name << "' does not resolve";
  std::vector<std::string> addresses;
  for (addrinfo* a = found; a; a = a->ai_next) {
    char text[NI_MAXHOST] = {};
    ::getnameinfo(a->ai_addr, a->ai_addrlen, text, sizeof(text), nullptr, 0, NI_NUMERICHOST);
    addresses.emplace_back(text);
  }
  ::freeaddrinfo(found);
  if (!net::loopback_alias(name, addresses))
    GTEST_SKIP() << "this machine's name '" << name << "' resolves to an address other machines can reach";
  const std::string bound = bound_address(net::listen_on(name, 0).get());
  EXPECT_TRUE(bound == "0.0.0.0" || bound == "::") << name << " was bound to " << bound;
}

TEST(FileStore, SetGetWaitAndSetIfAbsent) {
  testing::TempDir dir;
  auto a = make_file_store(dir.path());
  auto b = make_file_store(dir.path());
  a->set("job/0/k", "value");
  EXPECT_EQ(b->get("job/0/k", 0), "value");
  EXPECT_EQ(b->get("job/0/absent", 0.05), std::nullopt);
  EXPECT_TRUE(a->set_if_absent("f", "a"));
  EXPECT_FALSE(b->set_if_absent("f", "b"));
  EXPECT_EQ(b->get("f", 0), "a");
  EXPECT_EQ(b->wait({"f", "g"}, 0.05), (std::vector<std::string>{"g"}));
  // Only whole values are ever seen, and no temporary file is left.
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
}

TEST(FileStore, SymlinksAndFifosAreNotFollowed) {
  testing::TempDir dir;
  auto s = make_file_store(dir.path());
  const std::string target = dir.path() + "/target";
  std::ofstream(target) << "secret";
  ASSERT_EQ(::symlink(target.c_str(), (dir.path() + "/k.link").c_str()), 0);
  EXPECT_THROW(s->get("link", 0), UnavailableError);
  ASSERT_EQ(::mkfifo((dir.path() + "/k.fifo").c_str(), 0600), 0);
  EXPECT_THROW(s->get("fifo", 0), UnavailableError);  // neither blocks nor reads
  EXPECT_THROW(make_file_store(dir.path() + "/missing"), InvalidArgumentError);
}

}  // namespace
}  // namespace mirrored::detail::cluster
