// The TCP rendezvous store (runtime/tcp_store) against strangers and
// careless peers: a missing or wrong token, oversized keys and values,
// floods, clients that stall half-way through a request or never read, and
// the uninitialised bytes gloo put into the addresses it publishes.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ir/error.h"
#include "runtime/comm/collective.h"
#include "runtime/comm/gloo_communicator.h"
#include "runtime/comm/tcp_store.h"

using namespace flowjit;
using namespace flowjit::runtime;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

const std::string kToken = "tcp-store-test-token-0123456789";

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int connect_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A listening socket on a free loopback port.
int listen_loopback(int* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), len) != 0 || ::listen(fd, 8) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    return -1;
  }
  *port = ntohs(a.sin_port);
  return fd;
}

// A client speaking the wire format by hand (tcp_store.cpp's header). It
// reads the server's greeting (its nonce) on connect.
class Raw {
 public:
  explicit Raw(int port) {
    fd_ = connect_loopback(port);
    if (fd_ < 0) return;
    std::string g = read_n(1 + kStoreNonceBytes, milliseconds(2000));
    if (g.size() == 1 + kStoreNonceBytes && g[0] == 'C') nonce_ = g.substr(1);
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  void shut() { ::shutdown(fd_, SHUT_WR); }

  static void u32(std::string& m, uint32_t v) {
    for (int i = 0; i < 4; ++i) m += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  static void u64(std::string& m, uint64_t v) {
    for (int i = 0; i < 8; ++i) m += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  // The hello of a client that knows `token`, for this connection's nonce.
  std::string hello(const std::string& token) const {
    return "A" + client_nonce() + store_proof(token, "client", nonce_, client_nonce());
  }
  // The server's answer to it.
  std::string welcome(const std::string& token) const {
    return "K" + store_proof(token, "server", nonce_, client_nonce());
  }
  static std::string client_nonce() { return std::string(kStoreNonceBytes, 'c'); }
  const std::string& nonce() const { return nonce_; }
  static std::string get(const std::string& key) {
    std::string m = "G";
    u32(m, static_cast<uint32_t>(key.size()));
    return m + key;
  }
  // A set's header: the value's bytes are to follow.
  static std::string set_header(const std::string& key, uint64_t value_bytes) {
    std::string m = "S";
    u32(m, static_cast<uint32_t>(key.size()));
    m += key;
    u64(m, value_bytes);
    return m;
  }

  // Sends what the peer takes within 200 ms; returns the bytes sent.
  size_t send(const std::string& m) {
    size_t done = 0;
    while (done < m.size()) {
      pollfd p{fd_, POLLOUT, 0};
      if (::poll(&p, 1, 200) <= 0) break;
      ssize_t k = ::send(fd_, m.data() + done, m.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k <= 0) break;
      done += static_cast<size_t>(k);
    }
    return done;
  }

  // Up to n bytes, waiting at most `wait` for each.
  std::string read_n(size_t n, milliseconds wait) {
    std::string got;
    char buf[256];
    while (got.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) break;
      ssize_t k = ::recv(fd_, buf, std::min(sizeof(buf), n - got.size()), 0);
      if (k <= 0) break;
      got.append(buf, static_cast<size_t>(k));
    }
    return got;
  }

  // Everything received until the peer closes or `wait` passes quietly.
  std::string read_all(milliseconds wait, bool* closed = nullptr) {
    std::string got;
    if (closed) *closed = false;
    char buf[4096];
    for (;;) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(wait.count())) <= 0) return got;
      ssize_t k = ::recv(fd_, buf, sizeof(buf), 0);
      if (k <= 0) {
        if (closed) *closed = true;
        return got;
      }
      got.append(buf, static_cast<size_t>(k));
    }
  }

 private:
  int fd_ = -1;
  std::string nonce_;
};

// A refusal reply: 'E', u32 length, text.
std::string refusal_text(const std::string& reply) {
  if (reply.size() < 5 || reply[0] != 'E') return "(not a refusal: " + reply.substr(0, 16) + ")";
  return reply.substr(5);
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

}  // namespace

TEST(TcpStoreHardening, ClientsWithoutOrWithAWrongTokenAreRefused) {
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken);
  host.set("secret", {'s', '3'});

  // The library's client with a wrong token: a clear error, no retries.
  auto t0 = Clock::now();
  try {
    TcpStore wrong("127.0.0.1", host.port(), false, milliseconds(5000), kToken + "-not");
    ADD_FAILURE() << "a client with a wrong token connected";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Runtime);
    EXPECT_TRUE(contains(e.what(), "refused this process: wrong job token")) << e.what();
    EXPECT_TRUE(contains(e.what(), "FLOWJIT_STORE_TOKEN")) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 2.0);  // refused at once, not retried until the timeout

  // By hand: a get without the token reveals nothing and ends the connection.
  {
    Raw r(host.port());
    ASSERT_TRUE(r.ok());
    r.send(Raw::get("secret"));
    bool closed;
    std::string reply = r.read_all(milliseconds(2000), &closed);
    EXPECT_EQ(refusal_text(reply), "present the job's token first");
    EXPECT_FALSE(contains(reply, "s3"));
    EXPECT_TRUE(closed);
  }
  // A wrong token, then a get in the same packet: refused before the get.
  {
    Raw r(host.port());
    r.send(r.hello(std::string(kToken.size(), 'x')) + Raw::get("secret"));
    bool closed;
    std::string reply = r.read_all(milliseconds(2000), &closed);
    EXPECT_EQ(refusal_text(reply), "wrong job token");
    EXPECT_TRUE(closed);
  }
  // A prefix of the token, and the token with a byte more, are wrong too.
  for (const std::string& t : {kToken.substr(0, kToken.size() - 1), kToken + "x", std::string()}) {
    Raw r(host.port());
    r.send(r.hello(t));
    EXPECT_EQ(refusal_text(r.read_all(milliseconds(2000))), "wrong job token") << t;
  }
  // The right token is served.
  {
    Raw r(host.port());
    r.send(r.hello(kToken) + Raw::get("secret"));
    std::string reply = r.read_all(milliseconds(300));
    std::string want = r.welcome(kToken) + "V";
    Raw::u64(want, 2);
    EXPECT_EQ(reply, want + "s3");
  }
}

TEST(TcpStoreHardening, TheTokenComesFromTheEnvironmentAndMustBeLongEnough) {
  const char* saved = std::getenv(kStoreTokenEnv);
  std::string keep = saved ? saved : "";
  ::unsetenv(kStoreTokenEnv);
  try {
    resolve_store_token("");
    ADD_FAILURE() << "no token accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Value);
    EXPECT_TRUE(
        contains(e.what(), "needs the job's token in FLOWJIT_STORE_TOKEN, which is not set"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "python -m flowjit.launch")) << e.what();
  }
  ::setenv(kStoreTokenEnv, "short", 1);
  try {
    resolve_store_token("");
    ADD_FAILURE() << "a 5-character token accepted";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "FLOWJIT_STORE_TOKEN has 5 characters; it needs 16 to 1024"))
        << e.what();
  }
  ::setenv(kStoreTokenEnv, kToken.c_str(), 1);
  EXPECT_EQ(resolve_store_token(""), kToken);
  EXPECT_EQ(resolve_store_token("an-explicit-token-wins"), "an-explicit-token-wins");
  if (saved)
    ::setenv(kStoreTokenEnv, keep.c_str(), 1);
  else
    ::unsetenv(kStoreTokenEnv);

  // Two processes over TCP without any token: a clear error before anything listens.
  GlooOptions o;
  o.num_processes = 2;
  o.port = 1;
  o.store_token = "";
  if (!saved) {
    try {
      make_gloo_communicator(o);
      ADD_FAILURE() << "a TCP rendezvous without a token started";
    } catch (const UserError& e) {
      EXPECT_TRUE(contains(e.what(), "FLOWJIT_STORE_TOKEN")) << e.what();
    }
  }
}

TEST(TcpStoreHardening, OversizedKeysValuesAndTooManyKeysAreRefused) {
  TcpStoreLimits lim;
  lim.max_key_bytes = 64;
  lim.max_value_bytes = 1000;
  lim.max_keys = 3;
  lim.max_total_bytes = 2500;
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken, lim);
  auto expect_refused = [&](const std::function<void(TcpStore&)>& f, const std::string& why) {
    TcpStore c("127.0.0.1", host.port(), false, milliseconds(2000), kToken);
    try {
      f(c);
      ADD_FAILURE() << "not refused: " << why;
    } catch (const UserError& e) {
      EXPECT_TRUE(contains(e.what(), why)) << e.what();
    }
  };
  expect_refused([](TcpStore& c) { c.set(std::string(65, 'k'), {'v'}); },
                 "refused a set: a key of 65 bytes (at most 64)");
  expect_refused(
      [](TcpStore& c) {
        std::vector<char> v;
        c.try_get(std::string(100, 'k'), &v);
      },
      "refused a get: a key of 100 bytes (at most 64)");
  expect_refused([](TcpStore& c) { c.set("k", std::vector<char>(1001)); },
                 "a value of 1001 bytes for key k (at most 1000)");
  host.set("a", std::vector<char>(1000));
  host.set("b", std::vector<char>(1000));
  host.set("a", std::vector<char>(900));  // replacing counts the difference only
  expect_refused([](TcpStore& c) { c.set("c", std::vector<char>(700)); },
                 "would take the store past its 2500 bytes");
  host.set("c", std::vector<char>(10));
  expect_refused([](TcpStore& c) { c.set("d", {'x'}); }, "the store holds its most keys (3)");
  // What was accepted is intact, and the server still serves.
  TcpStore c("127.0.0.1", host.port(), false, milliseconds(2000), kToken);
  EXPECT_EQ(c.get("a").size(), 900u);
  EXPECT_EQ(c.get("b").size(), 1000u);
  EXPECT_EQ(c.get("c").size(), 10u);
  c.set("c", {'y'});
  EXPECT_EQ(host.get("c"), std::vector<char>{'y'});
}

TEST(TcpStoreHardening, AFloodOfBigValuesIsRefusedWithoutGrowingMemory) {
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken);
  // Strangers and token holders each announce 200 MiB values and start
  // sending them; nothing is allocated for them. (The test's own 4 MiB of
  // payload is made once, and one round runs before measuring: allocators,
  // ASan's quarantine included, keep what they have had.)
  const std::string payload(4 << 20, 'f');
  long before = 0;
  for (int i = 0; i < 6; ++i) {
    if (i == 1) before = rss_kib();
    for (bool with_token : {false, true}) {
      Raw r(host.port());
      ASSERT_TRUE(r.ok());
      std::string m = (with_token ? r.hello(kToken) : std::string()) +
                      Raw::set_header("flood" + std::to_string(i), uint64_t{200} << 20);
      r.send(m);
      r.send(payload);
      r.shut();
      std::string reply = r.read_all(milliseconds(2000));
      if (with_token) {
        ASSERT_GE(reply.size(), 1 + kStoreMacBytes);
        EXPECT_EQ(reply.substr(0, 1 + kStoreMacBytes), r.welcome(kToken));
        EXPECT_TRUE(
            contains(refusal_text(reply.substr(1 + kStoreMacBytes)), "a value of 209715200 bytes"))
            << reply.substr(0, 64);
      } else {
        EXPECT_EQ(refusal_text(reply), "present the job's token first");
      }
    }
  }
  long after = rss_kib();
  EXPECT_LT(after - before, 32 * 1024) << "RSS grew from " << before << " to " << after << " KiB";
  TcpStore c("127.0.0.1", host.port(), false, milliseconds(2000), kToken);
  std::vector<char> v;
  EXPECT_FALSE(c.try_get("flood0", &v));
}

TEST(TcpStoreHardening, StalledClientsBlockNobodyAndAreDroppedAfterTheTimeout) {
  TcpStoreLimits lim;
  lim.idle_timeout = milliseconds(400);
  lim.hello_timeout = milliseconds(300);
  TcpStore host("127.0.0.1", 0, true, milliseconds(3000), kToken, lim);
  host.set("big", std::vector<char>(1 << 20, 'b'));

  Raw half_hello(host.port());  // half the token, then nothing
  half_hello.send(half_hello.hello(kToken).substr(0, 10));
  Raw half_set(host.port());  // the token and half a set, then nothing
  half_set.send(half_set.hello(kToken) + Raw::set_header("k", 100) + "12345");
  Raw never_reads(host.port());  // asks for a megabyte 64 times and reads none of it
  std::string gets = never_reads.hello(kToken);
  for (int i = 0; i < 64; ++i) gets += Raw::get("big");
  never_reads.send(gets);
  std::vector<Raw*> stalled = {&half_hello, &half_set, &never_reads};

  // Meanwhile others are served at once.
  auto t0 = Clock::now();
  TcpStore c("127.0.0.1", host.port(), false, milliseconds(3000), kToken);
  for (int i = 0; i < 50; ++i) {
    c.set("n" + std::to_string(i), {static_cast<char>(i)});
    EXPECT_EQ(c.get("n" + std::to_string(i)), std::vector<char>{static_cast<char>(i)});
  }
  EXPECT_EQ(c.get("big").size(), size_t{1} << 20);
  EXPECT_LT(seconds_since(t0), 1.0);

  // And the stalled ones are closed after their timeouts.
  for (Raw* r : stalled) {
    bool closed = false;
    auto t1 = Clock::now();
    while (!closed && seconds_since(t1) < 5) r->read_all(milliseconds(100), &closed);
    EXPECT_TRUE(closed);
  }
  // A client closed for being idle reconnects by itself.
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_EQ(c.get("n7"), std::vector<char>{7});
  c.set("after", {'a'});
  EXPECT_EQ(host.get("after"), std::vector<char>{'a'});
}

TEST(TcpStoreHardening, ManyStrangersDoNotLockOutTheJob) {
  TcpStoreLimits lim;
  lim.max_unauthenticated = 8;
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken, lim);
  std::vector<std::unique_ptr<Raw>> strangers;
  for (int i = 0; i < 40; ++i) strangers.push_back(std::make_unique<Raw>(host.port()));
  TcpStore c("127.0.0.1", host.port(), false, milliseconds(2000), kToken);
  c.set("k", {'v'});
  EXPECT_EQ(host.get("k"), std::vector<char>{'v'});
  int closed_count = 0;
  for (auto& r : strangers) {
    bool closed;
    r->read_all(milliseconds(1), &closed);
    closed_count += closed;
  }
  EXPECT_GE(closed_count, 40 - 8);
}

TEST(TcpStoreHardening, GlooAddressesArePublishedWithoutStackBytes) {
  // The bytes of a gloo tcp address: sockaddr_storage, then the sequence number.
  std::vector<char> v(2 * 136, static_cast<char>(0xAB));
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_port = htons(1234);
  std::memcpy(v.data(), &in, 8);  // family, port, address; sin_zero stays 0xAB
  sockaddr_in6 in6{};
  in6.sin6_family = AF_INET6;
  std::memcpy(v.data() + 136, &in6, sizeof(in6));
  std::vector<char> seq(v.begin() + 128, v.begin() + 136);
  ASSERT_TRUE(ScrubbedAddressStore::scrub(v));
  for (size_t i = 8; i < 128; ++i) EXPECT_EQ(v[i], 0) << "byte " << i;
  EXPECT_EQ(std::vector<char>(v.begin() + 128, v.begin() + 136), seq);  // kept
  for (size_t i = 136 + sizeof(in6); i < 136 + 128; ++i) EXPECT_EQ(v[i], 0) << "byte " << i;
  std::vector<char> text = {'h', 'o', 's', 't'};
  EXPECT_FALSE(ScrubbedAddressStore::scrub(text));
  std::vector<char> odd(136, 0x11);  // not an address family
  EXPECT_FALSE(ScrubbedAddressStore::scrub(odd));
  EXPECT_EQ(odd, std::vector<char>(136, 0x11));
  // End to end: GlooMultiProcess.FileStore reads what three processes published.
}

TEST(TcpStoreHardening, PipelinedRequestsPastTheReplyBudgetAreAllAnswered) {
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken);
  host.set("big", std::vector<char>(1 << 20, 'b'));
  Raw r(host.port());
  std::string gets = r.hello(kToken);
  for (int i = 0; i < 8; ++i) gets += Raw::get("big");
  r.send(gets);
  std::string reply = r.read_all(milliseconds(1000));
  EXPECT_EQ(reply.size(), 1 + kStoreMacBytes + 8 * (9 + (size_t{1} << 20)));
}

// The token never crosses the wire: the hello is an HMAC over both nonces,
// bound to this connection's server nonce.
TEST(TcpStoreHardening, AnAnswerReplayedToAnotherNonceIsRefused) {
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken);
  host.set("secret", {'s', '3'});
  Raw first(host.port());
  ASSERT_EQ(first.nonce().size(), kStoreNonceBytes);
  std::string answer = first.hello(kToken);
  first.send(answer);
  EXPECT_EQ(first.read_all(milliseconds(300)), first.welcome(kToken));
  // The recorded answer on a new connection (another nonce): refused.
  Raw replay(host.port());
  ASSERT_NE(replay.nonce(), first.nonce()) << "nonces repeat";
  replay.send(answer + Raw::get("secret"));
  bool closed;
  std::string reply = replay.read_all(milliseconds(2000), &closed);
  EXPECT_EQ(refusal_text(reply), "wrong job token");
  EXPECT_FALSE(contains(reply, "s3"));
  EXPECT_TRUE(closed);
  // The same at the protocol level, with chosen nonces: an answer made for
  // nonce A does not open a session whose nonce is B.
  int n = 0;
  StoreProtocol p(kToken, {}, [&] { return std::string(kStoreNonceBytes, char('A' + n++)); });
  StoreProtocol::Session a(p), b(p);
  std::string cn(kStoreNonceBytes, 'c');
  std::string for_a = "A" + cn + store_proof(kToken, "client", a.nonce(), cn);
  std::vector<char> out;
  EXPECT_FALSE(b.feed(for_a.data(), for_a.size(), &out));
  EXPECT_FALSE(b.authenticated());
  out.clear();
  EXPECT_TRUE(a.feed(for_a.data(), for_a.size(), &out));
  EXPECT_TRUE(a.authenticated());
  std::string server = "K" + store_proof(kToken, "server", a.nonce(), cn);
  EXPECT_EQ(std::string(out.begin(), out.end()), server);
  // A client's MAC is not a server's: the roles differ.
  EXPECT_NE(store_proof(kToken, "client", a.nonce(), cn),
            store_proof(kToken, "server", a.nonce(), cn));
}

TEST(TcpStoreHardening, ASniffedExchangeHoldsNeitherTheTokenNorAReusableAnswer) {
  TcpStore host("127.0.0.1", 0, true, milliseconds(2000), kToken);
  // A forwarding proxy between a client and the server that records every
  // byte both ways (an eavesdropper on the network).
  int proxy_port = 0;
  int lfd = listen_loopback(&proxy_port);
  ASSERT_GE(lfd, 0);
  std::string seen;
  std::atomic<bool> stop{false};
  std::thread proxy([&] {
    while (!stop) {
      pollfd lp{lfd, POLLIN, 0};
      if (::poll(&lp, 1, 50) <= 0) continue;
      int c = ::accept(lfd, nullptr, nullptr);
      int s = connect_loopback(host.port());
      if (c < 0 || s < 0) break;
      char buf[4096];
      for (bool open = true; open && !stop;) {
        pollfd fds[2] = {{c, POLLIN, 0}, {s, POLLIN, 0}};
        if (::poll(fds, 2, 50) <= 0) continue;
        for (int i = 0; i < 2 && open; ++i) {
          if (!fds[i].revents) continue;
          ssize_t k = ::recv(fds[i].fd, buf, sizeof(buf), 0);
          if (k <= 0) {
            open = false;
            break;
          }
          seen.append(buf, static_cast<size_t>(k));
          ::send(fds[1 - i].fd, buf, static_cast<size_t>(k), MSG_NOSIGNAL);
        }
      }
      ::close(c);
      ::close(s);
    }
  });
  {
    TcpStore c("127.0.0.1", proxy_port, false, milliseconds(2000), kToken);
    c.set("through-the-proxy", {'v', '1'});
    EXPECT_EQ(host.get("through-the-proxy"), (std::vector<char>{'v', '1'}));
  }
  stop = true;
  proxy.join();
  ::close(lfd);
  EXPECT_TRUE(contains(seen, "through-the-proxy")) << "the proxy saw the exchange";
  EXPECT_FALSE(contains(seen, kToken));
  // Nor any 8-byte run of it.
  for (size_t i = 0; i + 8 <= kToken.size(); ++i)
    EXPECT_FALSE(contains(seen, kToken.substr(i, 8))) << "token bytes from " << i;
  // What the eavesdropper saw does not open a connection of its own.
  size_t hello_at = seen.find('A', 1 + kStoreNonceBytes);
  ASSERT_NE(hello_at, std::string::npos);
  Raw replay(host.port());
  replay.send(seen.substr(hello_at, 1 + kStoreNonceBytes + kStoreMacBytes));
  EXPECT_EQ(refusal_text(replay.read_all(milliseconds(2000))), "wrong job token");
}

// Mutual: a server that does not know the token (another program on the
// port, or one pretending to be the store) is refused by the client.
TEST(TcpStoreHardening, AServerThatDoesNotKnowTheTokenIsRefusedByTheClient) {
  int port = 0;
  int lfd = listen_loopback(&port);
  ASSERT_GE(lfd, 0);
  std::thread impostor([&] {
    int c = ::accept(lfd, nullptr, nullptr);
    if (c < 0) return;
    std::string greet = "C" + std::string(kStoreNonceBytes, 'n');
    ::send(c, greet.data(), greet.size(), MSG_NOSIGNAL);
    char buf[1 + kStoreNonceBytes + kStoreMacBytes];
    size_t got = 0;
    while (got < sizeof(buf)) {
      ssize_t k = ::recv(c, buf + got, sizeof(buf) - got, 0);
      if (k <= 0) break;
      got += static_cast<size_t>(k);
    }
    std::string welcome = "K" + std::string(kStoreMacBytes, 'm');  // it cannot make the MAC
    ::send(c, welcome.data(), welcome.size(), MSG_NOSIGNAL);
    char ignored;
    ::recv(c, &ignored, 1, 0);  // until the client closes
    ::close(c);
  });
  try {
    TcpStore c("127.0.0.1", port, false, milliseconds(2000), kToken);
    ADD_FAILURE() << "a client accepted a server that does not know the token";
  } catch (const UserError& e) {
    EXPECT_TRUE(contains(e.what(), "does not know this job's token")) << e.what();
  }
  impostor.join();
  ::close(lfd);
}
