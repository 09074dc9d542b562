// The rendezvous stores of runtime/comm/tcp_store.h: the TCP server and client,
// and the directory store.
//
// Wire format of the TCP store, integers little-endian:
//   on connect, the server:  'C' server_nonce[32]
//   hello: 'A' client_nonce[32] client_mac[32]       ->  'K' server_mac[32]
//   set:   'S' u32 key_len key u64 value_len value   ->  'K'
//   get:   'G' u32 key_len key                       ->  'N' | 'V' u64 value_len value
// client_mac and server_mac: store_proof(token, "client" | "server",
// server_nonce, client_nonce). The hello comes first on every connection;
// the client checks server_mac before it sends anything else. Any request may instead be
// answered 'E' u32 text_len text (a refusal: wrong token, over a cap,
// malformed), after which the server closes the connection. A get never
// waits on the server; waiting is polling on the client, which keeps the
// server a plain request/response loop over non-blocking sockets.
#include "runtime/comm/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "ir/error.h"
#include "runtime/sha256.h"

namespace flowjit::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string seconds_text(milliseconds ms) { return str(ms.count() / 1000.0, " s"); }

int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

void put_u32(std::vector<char>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_u64(std::vector<char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

void put_key(std::vector<char>& out, char op, const std::string& key) {
  out.push_back(op);
  put_u32(out, static_cast<uint32_t>(key.size()));
  out.insert(out.end(), key.begin(), key.end());
}

// Reads fields off the front of a partly received request; every read fails
// (and stays failed) when the bytes are not all there yet.
class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), n_(n) {}
  bool bytes(size_t k, const char** out) {
    if (!ok_ || n_ - pos_ < k) return ok_ = false;
    *out = p_ + pos_;
    pos_ += k;
    return true;
  }
  bool u8(uint8_t* v) {
    const char* b;
    if (!bytes(1, &b)) return false;
    *v = static_cast<uint8_t>(*b);
    return true;
  }
  bool u32(uint32_t* v) {
    const char* b;
    if (!bytes(4, &b)) return false;
    *v = static_cast<uint32_t>(get_le(b, 4));
    return true;
  }
  bool u64(uint64_t* v) {
    const char* b;
    if (!bytes(8, &b)) return false;
    *v = get_le(b, 8);
    return true;
  }
  size_t consumed() const { return pos_; }

 private:
  const char* p_;
  size_t n_, pos_ = 0;
  bool ok_ = true;
};

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Blocking send of everything; MSG_NOSIGNAL so that a vanished peer is an
// error return, not a SIGPIPE that kills the process.
bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

struct AddrInfo {
  addrinfo* list = nullptr;
  ~AddrInfo() {
    if (list) freeaddrinfo(list);
  }
};

int resolve(const std::string& host, int port, bool passive, AddrInfo* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  std::string service = std::to_string(port);
  return getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &out->list);
}

// One non-blocking connect attempt, bounded by `deadline`. Returns a blocking
// connected socket, or -1 with the reason in *err.
int try_connect(const addrinfo* ai, Clock::time_point deadline, std::string* err) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0) {
    *err = std::strerror(errno);
    return -1;
  }
  int rv = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rv < 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int pr;
    do pr = ::poll(&p, 1, std::max(1, remaining_ms(deadline)));
    while (pr < 0 && errno == EINTR);
    int so_error = ETIMEDOUT;
    socklen_t len = sizeof(so_error);
    if (pr > 0) getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
    rv = so_error == 0 ? 0 : -1;
    errno = so_error;
  }
  if (rv < 0) {
    *err = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  set_nodelay(fd);
  return fd;
}

}  // namespace

// ---------------------------------------------------------------------------
// RendezvousStore

bool RendezvousStore::check(const std::vector<std::string>& keys) {
  std::vector<char> ignored;
  for (const auto& k : keys)
    if (!try_get(k, &ignored)) return false;
  return true;
}

void RendezvousStore::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  // gloo's convention: a zero timeout means none.
  auto deadline = timeout.count() > 0 ? Clock::now() + timeout : Clock::time_point::max();
  // Poll quickly at first (peers usually arrive together), then back off.
  milliseconds pause(1);
  while (!check(keys)) {
    if (Clock::now() >= deadline) {
      std::string names;
      for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw_user(ErrorKind::Runtime, "gloo: timed out after ", seconds_text(timeout),
                 " waiting for ", names, " at ", where());
    }
    auto nap = pause;
    if (timeout.count() > 0) nap = std::min(nap, milliseconds(remaining_ms(deadline) + 1));
    std::this_thread::sleep_for(nap);
    pause = std::min(pause * 2, milliseconds(50));
  }
}

std::vector<char> RendezvousStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::vector<char> value;
  FJ_USER_CHECK(try_get(key, &value), ErrorKind::Runtime, "gloo: key ", key, " vanished from ",
                where());
  return value;
}

// ---------------------------------------------------------------------------
// StoreProtocol: the server's side of the wire format.

namespace {

void put_refusal(std::vector<char>* out, const std::string& why) {
  out->push_back('E');
  put_u32(*out, static_cast<uint32_t>(why.size()));
  out->insert(out->end(), why.begin(), why.end());
}

// Replies queued past this many bytes stop the parsing of further
// requests until they are sent (a client pipelining gets of a big value
// cannot make the server hold many copies of it).
constexpr size_t kReplyBudget = size_t{1} << 20;

}  // namespace

std::string store_proof(const std::string& token, const char* role, const std::string& server_nonce,
                        const std::string& client_nonce) {
  std::string msg = std::string("flowjit-store-v1 ") + role;
  msg += '\0';
  msg += server_nonce;
  msg += client_nonce;
  auto mac = hmac_sha256(token, msg);
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t k = ::getrandom(out.data() + got, n - got, 0);
    if (k < 0 && errno == EINTR) continue;
    FJ_USER_CHECK(k > 0, ErrorKind::Runtime,
                  "gloo: no random bytes for the rendezvous store: ", std::strerror(errno));
    got += static_cast<size_t>(k);
  }
  return out;
}

StoreProtocol::Session::Session(StoreProtocol& store)
    : store_(store), nonce_(store.nonces_ ? store.nonces_() : random_bytes(kStoreNonceBytes)) {
  FJ_CHECK(nonce_.size() == kStoreNonceBytes, "a store nonce of ", nonce_.size(), " bytes");
}

void StoreProtocol::Session::greet(std::vector<char>* out) const {
  out->push_back('C');
  out->insert(out->end(), nonce_.begin(), nonce_.end());
}

bool StoreProtocol::Session::feed(const char* p, size_t n, std::vector<char>* out) {
  if (closed_) return false;
  in_.insert(in_.end(), p, p + n);
  return resume(out);
}

bool StoreProtocol::Session::resume(std::vector<char>* out) {
  if (closed_) return false;
  size_t done = 0;
  bool ok = true;
  backlog_ = false;
  while (ok) {
    if (out->size() >= kReplyBudget) {
      backlog_ = done < in_.size();
      break;
    }
    size_t used = 0;
    ok = step(in_.data() + done, in_.size() - done, out, &used);
    if (used == 0) break;  // an incomplete request: wait for more bytes
    done += used;
  }
  if (!ok) {
    closed_ = true;
    in_.clear();
    in_.shrink_to_fit();
    return false;
  }
  in_.erase(in_.begin(), in_.begin() + static_cast<std::ptrdiff_t>(done));
  return true;
}

// Parses and answers one request at the front of [p, p + n). *used: its
// bytes, 0 when it is not all there yet. False: refused (reply queued).
bool StoreProtocol::Session::step(const char* p, size_t n, std::vector<char>* out, size_t* used) {
  const TcpStoreLimits& lim = store_.limits_;
  Reader r(p, n);
  uint8_t op;
  uint32_t len;
  *used = 0;
  if (!r.u8(&op)) return true;
  if (!authenticated_) {
    if (op != 'A') {
      put_refusal(out, "present the job's token first");
      return false;
    }
    const char *client_nonce, *mac;
    if (!r.bytes(kStoreNonceBytes, &client_nonce) || !r.bytes(kStoreMacBytes, &mac)) return true;
    std::string cn(client_nonce, kStoreNonceBytes);
    if (!constant_time_equal(std::string_view(mac, kStoreMacBytes),
                             store_proof(store_.token_, "client", nonce_, cn))) {
      put_refusal(out, "wrong job token");
      return false;
    }
    authenticated_ = true;
    out->push_back('K');
    std::string proof = store_proof(store_.token_, "server", nonce_, cn);
    out->insert(out->end(), proof.begin(), proof.end());
    *used = r.consumed();
    return true;
  }
  if (op != 'S' && op != 'G') {
    put_refusal(out, str("unknown request 0x", std::hex, int{op}));
    return false;
  }
  if (!r.u32(&len)) return true;
  if (len > lim.max_key_bytes) {
    put_refusal(out, str("a key of ", len, " bytes (at most ", lim.max_key_bytes, ")"));
    return false;
  }
  const char* key;
  if (!r.bytes(len, &key)) return true;
  std::string k(key, len);
  if (op == 'G') {
    auto it = store_.data_.find(k);
    if (it == store_.data_.end()) {
      out->push_back('N');
    } else {
      out->push_back('V');
      put_u64(*out, it->second.size());
      out->insert(out->end(), it->second.begin(), it->second.end());
    }
    *used = r.consumed();
    return true;
  }
  uint64_t vlen;
  if (!r.u64(&vlen)) return true;
  // Every cap is checked on the header, before the value is received.
  if (vlen > lim.max_value_bytes) {
    put_refusal(out, str("a value of ", vlen, " bytes for key ", k, " (at most ",
                         lim.max_value_bytes, ")"));
    return false;
  }
  auto it = store_.data_.find(k);
  uint64_t held = it == store_.data_.end() ? 0 : it->second.size() + k.size();
  if (it == store_.data_.end() && store_.data_.size() >= lim.max_keys) {
    put_refusal(out, str("the store holds its most keys (", lim.max_keys, ")"));
    return false;
  }
  if (store_.bytes_ - held + k.size() + vlen > lim.max_total_bytes) {
    put_refusal(out, str("setting ", vlen, " bytes for key ", k, " would take the store past its ",
                         lim.max_total_bytes, " bytes"));
    return false;
  }
  const char* value;
  if (!r.bytes(static_cast<size_t>(vlen), &value)) return true;
  store_.bytes_ += k.size() + vlen - held;
  store_.data_[k].assign(value, value + vlen);
  out->push_back('K');
  *used = r.consumed();
  return true;
}

// ---------------------------------------------------------------------------
// ScrubbedAddressStore

bool ScrubbedAddressStore::scrub(std::vector<char>& value) {
  // A gloo::transport::tcp::Address: struct { sockaddr_storage ss; ssize_t seq; }.
  constexpr size_t kAddress = sizeof(sockaddr_storage) + sizeof(ssize_t);
  static_assert(kAddress == 136, "gloo's tcp address layout on Linux");
  if (value.empty() || value.size() % kAddress != 0) return false;
  for (size_t at = 0; at < value.size(); at += kAddress) {
    sa_family_t family;
    std::memcpy(&family, value.data() + at + offsetof(sockaddr_storage, ss_family), sizeof(family));
    if (family != AF_INET && family != AF_INET6) return false;
  }
  for (size_t at = 0; at < value.size(); at += kAddress) {
    char* a = value.data() + at;
    sa_family_t family;
    std::memcpy(&family, a + offsetof(sockaddr_storage, ss_family), sizeof(family));
    if (family == AF_INET) {
      std::memset(a + offsetof(sockaddr_in, sin_zero), 0, sizeof(sockaddr_in::sin_zero));
      std::memset(a + sizeof(sockaddr_in), 0, sizeof(sockaddr_storage) - sizeof(sockaddr_in));
    } else {
      std::memset(a + sizeof(sockaddr_in6), 0, sizeof(sockaddr_storage) - sizeof(sockaddr_in6));
    }
  }
  return true;
}

void ScrubbedAddressStore::set(const std::string& key, const std::vector<char>& value) {
  bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
  if (!digits) return inner_.set(key, value);
  std::vector<char> copy = value;
  scrub(copy);
  inner_.set(key, copy);
}

// ---------------------------------------------------------------------------
// TcpStoreServer: one thread polling the listening socket, its non-blocking
// connections and a pipe that tells it to stop.

class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, const std::string& token,
                 const TcpStoreLimits& limits)
      : protocol_(token, limits), limits_(limits) {
    FJ_CHECK(!token.empty(), "the store's token must be resolved first");
    AddrInfo ai;
    int rv = resolve(host, port, false, &ai);
    FJ_USER_CHECK(rv == 0, ErrorKind::Runtime, "gloo: cannot resolve the rendezvous address ", host,
                  ": ", gai_strerror(rv));
    std::string err = "no address";
    for (addrinfo* a = ai.list; a && listen_fd_ < 0; a = a->ai_next) {
      int fd =
          ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
      if (fd < 0) continue;
      // A store of an earlier job on this port may have left it in TIME_WAIT.
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
        listen_fd_ = fd;
        break;
      }
      err = std::strerror(errno);
      ::close(fd);
    }
    FJ_USER_CHECK(listen_fd_ >= 0, ErrorKind::Runtime,
                  "gloo: process 0 could not host the rendezvous store at ", host, ":", port, ": ",
                  err);
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (::pipe2(wake_, O_CLOEXEC) != 0) {
      ::close(listen_fd_);
      throw_user(ErrorKind::Runtime, "gloo: pipe: ", std::strerror(errno));
    }
    thread_ = std::thread([this] { run(); });
  }

  ~TcpStoreServer() {
    char c = 0;
    while (::write(wake_[1], &c, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
    ::close(listen_fd_);
  }

  int port() const { return port_; }

 private:
  struct Conn {
    Conn(int f, StoreProtocol& p, Clock::time_point d) : fd(f), session(p), deadline(d) {}
    int fd;
    StoreProtocol::Session session;
    std::vector<char> out;  // replies not yet sent, from out[sent]
    size_t sent = 0;
    // Closing: no more requests are answered; once `out` is sent the write
    // side is shut and input is read and dropped until the client closes
    // (or the deadline), so that it reads the refusal rather than a reset.
    bool closing = false, shut = false, done = false;
    Clock::time_point deadline;
  };

  void run() {
    std::vector<std::unique_ptr<Conn>> conns;
    Clock::time_point accept_again{};  // accepting paused until then (out of descriptors)
    for (;;) {
      auto now = Clock::now();
      // Drop the connections past their deadline, and those done.
      std::vector<std::unique_ptr<Conn>> alive;
      for (auto& c : conns) {
        if (now >= c->deadline || c->done)
          ::close(c->fd);
        else
          alive.push_back(std::move(c));
      }
      conns = std::move(alive);
      Clock::time_point wake_at = accept_again > now ? accept_again : Clock::time_point::max();
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      if (accept_again > now) fds[1].fd = -1;
      for (const auto& c : conns) {
        // Read only once the replies so far are sent and parsed requests
        // are answered: a client that does not read stalls only itself.
        // (With answers held back, POLLOUT wakes us at once to resume them.)
        bool sending = c->sent < c->out.size() || (c->session.backlog() && !c->closing);
        short events = sending ? POLLOUT : POLLIN;
        fds.push_back({c->fd, events, 0});
        wake_at = std::min(wake_at, c->deadline);
      }
      int wait_ms = wake_at == Clock::time_point::max() ? -1 : std::max(1, remaining_ms(wake_at));
      int rv = ::poll(fds.data(), fds.size(), wait_ms);
      if (rv < 0 && errno == EINTR) continue;
      if (rv < 0 || fds[0].revents) break;
      for (size_t i = 0; i < conns.size(); ++i)
        if (fds[i + 2].revents) serve(*conns[i]);
      if (fds[1].fd >= 0 && (fds[1].revents & POLLIN)) accept_all(conns, &accept_again);
    }
    for (const auto& c : conns) ::close(c->fd);
  }

  void accept_all(std::vector<std::unique_ptr<Conn>>& conns, Clock::time_point* accept_again) {
    for (;;) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          *accept_again = Clock::now() + milliseconds(100);
        return;  // EAGAIN: none left; anything else: try at the next wake-up
      }
      if (conns.size() >= limits_.max_connections) {
        ::close(fd);
        continue;
      }
      size_t strangers = 0;
      for (const auto& c : conns) strangers += !c->session.authenticated();
      if (strangers >= limits_.max_unauthenticated) {
        // Make room by closing the stranger that has waited longest.
        for (auto it = conns.begin(); it != conns.end(); ++it) {
          if ((*it)->session.authenticated()) continue;
          ::close((*it)->fd);
          conns.erase(it);
          break;
        }
      }
      set_nodelay(fd);
      std::unique_ptr<Conn> c;
      try {
        c = std::make_unique<Conn>(fd, protocol_, Clock::now() + limits_.hello_timeout);
      } catch (const std::exception&) {  // no nonce (no randomness): not served
        ::close(fd);
        continue;
      }
      c->session.greet(&c->out);
      conns.push_back(std::move(c));
    }
  }

  // Sends what it can, reads what is there, answers complete requests.
  void serve(Conn& c) {
    if (c.sent < c.out.size() && !flush(c)) return;
    char buf[1 << 16];
    for (int round = 0; round < 16 && c.sent == c.out.size() && !c.done; ++round) {
      if (c.closing) {
        if (!c.shut) {
          ::shutdown(c.fd, SHUT_WR);
          c.shut = true;
        }
        ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) c.done = true;
        continue;
      }
      bool ok;
      if (c.session.backlog()) {
        ok = c.session.resume(&c.out);
      } else {
        ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (n <= 0) {  // closed by the client, or broken
          c.done = true;
          return;
        }
        ok = c.session.feed(buf, static_cast<size_t>(n), &c.out);
      }
      // Before the token, the deadline set at accept stands (a stranger
      // cannot extend it by trickling bytes); after it, activity extends it.
      if (c.session.authenticated()) c.deadline = Clock::now() + limits_.idle_timeout;
      if (!ok) {
        c.closing = true;
        // A refusal gets a short while to be read, not the idle timeout.
        c.deadline = std::min(c.deadline, Clock::now() + milliseconds(1000));
      }
      if (!flush(c)) return;
    }
  }

  // Sends queued replies without blocking; false when the connection broke.
  bool flush(Conn& c) {
    while (c.sent < c.out.size()) {
      ssize_t k = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      if (k <= 0) {
        c.done = true;
        return false;
      }
      c.sent += static_cast<size_t>(k);
      if (c.session.authenticated() && !c.closing)
        c.deadline = std::max(c.deadline, Clock::now() + limits_.idle_timeout);
    }
    c.out.clear();
    c.sent = 0;
    return true;
  }

  StoreProtocol protocol_;
  TcpStoreLimits limits_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
};

namespace {

// The servers this process hosts, by address, so that communicators created
// with the same master address and port share one (a second bind would fail).
std::shared_ptr<TcpStoreServer> acquire_server(const std::string& host, int port,
                                               const std::string& token,
                                               const TcpStoreLimits& limits) {
  static std::mutex mu;
  static auto* servers = new std::map<std::string, std::weak_ptr<TcpStoreServer>>();
  std::lock_guard<std::mutex> lock(mu);
  if (port != 0) {
    if (auto s = (*servers)[host + ":" + std::to_string(port)].lock()) return s;
  }
  // Port 0: the kernel's pick, registered under it so that later hosts
  // naming that port join this server.
  auto s = std::make_shared<TcpStoreServer>(host, port, token, limits);
  (*servers)[host + ":" + std::to_string(s->port())] = s;
  return s;
}

// The server said no: not retried, not reconnected.
class Refused : public UserError {
 public:
  explicit Refused(std::string msg) : UserError(ErrorKind::Runtime, std::move(msg)) {}
};

const char* const kTokenHowTo =
    " (every process of a job needs the same secret there: python -m flowjit.launch sets one, "
    "or export FLOWJIT_STORE_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))') "
    "before starting the processes)";

}  // namespace

std::string resolve_store_token(const std::string& token) {
  std::string t = token;
  const char* from = "the store token";
  if (t.empty()) {
    const char* env = std::getenv(kStoreTokenEnv);
    FJ_USER_CHECK(env && *env, ErrorKind::Value,
                  "gloo: a rendezvous over TCP needs the job's token in ", kStoreTokenEnv,
                  ", which is not set", kTokenHowTo);
    t = env;
    from = kStoreTokenEnv;
  }
  FJ_USER_CHECK(t.size() >= kMinStoreTokenBytes && t.size() <= kMaxStoreTokenBytes,
                ErrorKind::Value, "gloo: ", from, " has ", t.size(), " characters; it needs ",
                kMinStoreTokenBytes, " to ", kMaxStoreTokenBytes, kTokenHowTo);
  return t;
}

// ---------------------------------------------------------------------------
// TcpStore

TcpStore::TcpStore(const std::string& host, int port, bool host_server, milliseconds timeout,
                   const std::string& token, const TcpStoreLimits& limits)
    : RendezvousStore(timeout),
      host_(host),
      port_(port),
      token_(resolve_store_token(token)),
      max_value_bytes_(limits.max_value_bytes) {
  if (host_server) {
    server_ = acquire_server(host, port, token_, limits);
    port_ = server_->port();
  }
  connect_until(Clock::now() + timeout);
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStore::where() const { return host_ + ":" + std::to_string(port_); }

void TcpStore::connect_until(Clock::time_point deadline) {
  std::string err = "no address";
  for (;;) {
    AddrInfo ai;
    int rv = resolve(host_, port_, false, &ai);
    FJ_USER_CHECK(rv == 0, ErrorKind::Runtime, "gloo: cannot resolve the rendezvous address ",
                  host_, ": ", gai_strerror(rv));
    for (addrinfo* a = ai.list; a && fd_ < 0; a = a->ai_next) fd_ = try_connect(a, deadline, &err);
    if (fd_ >= 0) {
      if (hello(&err)) return;
      ::close(fd_);
      fd_ = -1;
    }
    if (Clock::now() >= deadline) break;
    // The hosting process may not be up yet: retry until the deadline.
    std::this_thread::sleep_for(milliseconds(std::min(50, std::max(1, remaining_ms(deadline)))));
  }
  throw_user(ErrorKind::Runtime, "gloo: could not reach the rendezvous store at ", where(),
             " within ", seconds_text(timeout()), " (is process 0 running?): ", err);
}

// Proves on a fresh connection that this process knows the token, and
// checks the server's proof. False when the connection broke (the caller
// retries); a refusal, and a server that does not know the token, throw.
bool TcpStore::hello(std::string* err) {
  auto deadline = Clock::now() + timeout();
  char greeting[1 + kStoreNonceBytes];
  if (!read_exact(greeting, sizeof greeting, deadline, err)) return false;
  if (greeting[0] != 'C') {
    *err = "malformed greeting";
    return false;
  }
  std::string server_nonce(greeting + 1, kStoreNonceBytes);
  std::string client_nonce = random_bytes(kStoreNonceBytes);
  std::string mac = store_proof(token_, "client", server_nonce, client_nonce);
  std::vector<char> msg, reply;
  msg.push_back('A');
  msg.insert(msg.end(), client_nonce.begin(), client_nonce.end());
  msg.insert(msg.end(), mac.begin(), mac.end());
  if (!exchange(msg, &reply, err, "connect")) return false;
  if (reply[0] != 'K') {
    *err = "malformed answer";
    return false;
  }
  char proof[kStoreMacBytes];
  if (!read_exact(proof, sizeof proof, deadline, err)) return false;
  if (!constant_time_equal(std::string_view(proof, sizeof proof),
                           store_proof(token_, "server", server_nonce, client_nonce))) {
    ::close(fd_);
    fd_ = -1;
    throw Refused(str("gloo: the rendezvous store at ", where(),
                      " does not know this job's token (", kStoreTokenEnv,
                      " differs from process 0's, or another program listens there)", kTokenHowTo));
  }
  return true;
}

// Reads exactly n bytes before `deadline`; false when the connection is
// gone, throws when nothing comes in time.
bool TcpStore::read_exact(char* p, size_t n, Clock::time_point deadline, std::string* err) {
  while (n > 0) {
    pollfd pfd{fd_, POLLIN, 0};
    int pr = ::poll(&pfd, 1, remaining_ms(deadline));
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0)
      throw_user(ErrorKind::Runtime, "gloo: the rendezvous store at ", where(),
                 " did not answer within ", seconds_text(timeout()));
    ssize_t k = pr < 0 ? -1 : ::recv(fd_, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      *err = k == 0 ? "connection closed" : std::strerror(errno);
      return false;
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Sends `msg` and reads the reply (its first byte, and for 'V' the value).
// False when the connection is gone; throws when the server does not answer
// or refuses the request.
bool TcpStore::exchange(const std::vector<char>& msg, std::vector<char>* reply, std::string* err,
                        const char* what) {
  auto deadline = Clock::now() + timeout();
  auto read_exact = [&](char* p, size_t n) { return this->read_exact(p, n, deadline, err); };
  // A server that refuses a big request stops reading it: its refusal may be
  // waiting although the send failed.
  bool sent = send_all(fd_, msg.data(), msg.size());
  if (!sent) {
    *err = std::strerror(errno);
    pollfd pfd{fd_, POLLIN, 0};
    if (::poll(&pfd, 1, 0) <= 0) return false;
  }
  char tag;
  if (!read_exact(&tag, 1)) return false;
  reply->assign(1, tag);
  if (tag == 'E') {
    char len[4];
    std::string why = "(no reason given)";
    if (read_exact(len, 4)) {
      uint64_t n = std::min<uint64_t>(get_le(len, 4), 4096);
      std::string text(n, '\0');
      if (read_exact(text.data(), n)) why = text;
    }
    ::close(fd_);
    fd_ = -1;
    if (why == "wrong job token")
      throw Refused(str("gloo: the rendezvous store at ", where(),
                        " refused this process: wrong job token (", kStoreTokenEnv,
                        " differs from process 0's)", kTokenHowTo));
    throw Refused(str("gloo: the rendezvous store at ", where(), " refused a ", what, ": ", why));
  }
  if (!sent) return false;
  if (tag == 'V') {
    char len[8];
    if (!read_exact(len, 8)) return false;
    uint64_t n = get_le(len, 8);
    if (n > max_value_bytes_) {
      *err = "malformed answer";
      return false;
    }
    reply->resize(1 + n);
    return read_exact(reply->data() + 1, n);
  }
  if (tag != 'K' && tag != 'N') {
    *err = "malformed answer";
    return false;
  }
  return true;
}

void TcpStore::request(const std::vector<char>& msg, std::vector<char>* reply, const char* what) {
  std::string err = "not connected";
  if (fd_ >= 0 && exchange(msg, reply, &err, what)) return;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  // The server may have closed an idle connection, or been replaced (a host
  // serving an earlier communicator on this port, now the next one):
  // reconnect and set this client's keys again.
  try {
    connect_until(Clock::now() + timeout());
  } catch (const Refused&) {
    throw;
  } catch (const UserError&) {
    // Report the loss, not the failed retry.
  }
  bool ok = fd_ >= 0;
  std::vector<char> ignored;
  for (size_t i = 0; ok && i < sets_.size(); ++i) ok = exchange(sets_[i], &ignored, &err, "set");
  if (ok && exchange(msg, reply, &err, what)) return;
  throw_user(ErrorKind::Runtime, "gloo: lost the connection to the rendezvous store at ", where(),
             " during ", what, " (did process 0 exit?): ", err);
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  FJ_USER_CHECK(value.size() <= max_value_bytes_, ErrorKind::Runtime, "gloo: a value of ",
                value.size(), " bytes for key ", key, " is over the rendezvous store's ",
                max_value_bytes_, " bytes");
  std::vector<char> msg, reply;
  put_key(msg, 'S', key);
  put_u64(msg, value.size());
  msg.insert(msg.end(), value.begin(), value.end());
  request(msg, &reply, "set");
  // Replayed after a reconnect; a later set of the same key replaces it.
  for (auto it = sets_.begin(); it != sets_.end(); ++it) {
    auto prefix = static_cast<std::ptrdiff_t>(5 + key.size());
    if (static_cast<std::ptrdiff_t>(it->size()) >= prefix &&
        std::equal(msg.begin(), msg.begin() + prefix, it->begin())) {
      sets_.erase(it);
      break;
    }
  }
  sets_.push_back(std::move(msg));
}

bool TcpStore::try_get(const std::string& key, std::vector<char>* value) {
  std::vector<char> msg, reply;
  put_key(msg, 'G', key);
  request(msg, &reply, "get");
  if (reply[0] != 'V') return false;
  value->assign(reply.begin() + 1, reply.end());
  return true;
}

// ---------------------------------------------------------------------------
// FileStore

FileStore::FileStore(const std::string& dir, milliseconds timeout)
    : RendezvousStore(timeout), dir_(dir) {
  FJ_USER_CHECK(!dir.empty(), ErrorKind::Value, "gloo: the file store needs a directory");
  // mkdir -p: every process may race to create it.
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos < dir.size() && dir[pos] != '/') continue;
    std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST)
      throw_user(ErrorKind::Runtime, "gloo: cannot create the file store directory ", prefix, ": ",
                 std::strerror(errno));
  }
  struct stat st;
  FJ_USER_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), ErrorKind::Runtime,
                "gloo: the file store path ", dir, " is not a directory");
  // Whoever can write the directory can forge any process's keys.
  FJ_USER_CHECK(
      st.st_uid == ::geteuid() && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0, ErrorKind::Runtime,
      "gloo: the file store directory ", dir,
      st.st_uid == ::geteuid() ? " is writable by its group or others" : " belongs to another user",
      "; use a directory of your own that only you can write (mode 0700)");
}

// Keys become file names: characters outside [A-Za-z0-9._-] are %XX-escaped,
// so names stay readable and distinct keys stay distinct files.
std::string FileStore::path_of(const std::string& key) const {
  static const char* hex = "0123456789ABCDEF";
  std::string name = "k_";
  for (unsigned char ch : key) {
    if (std::isalnum(ch) || ch == '.' || ch == '_' || ch == '-') {
      name += static_cast<char>(ch);
    } else {
      name += '%';
      name += hex[ch >> 4];
      name += hex[ch & 15];
    }
  }
  if (name.size() > 200) {
    // Over NAME_MAX; keep a readable head and make the rest a hash (the
    // same in every process, which all run the same binary).
    name = name.substr(0, 160) + "%" + std::to_string(std::hash<std::string>()(name));
  }
  return dir_ + "/" + name;
}

void FileStore::set(const std::string& key, const std::vector<char>& value) {
  static std::atomic<uint64_t> counter{0};
  std::string path = path_of(key);
  std::string tmp = dir_ + "/.tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  FJ_USER_CHECK(fd >= 0, ErrorKind::Runtime, "gloo: cannot write ", tmp, ": ",
                std::strerror(errno));
  const char* p = value.data();
  size_t n = value.size();
  while (n > 0) {
    ssize_t k = ::write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw_user(ErrorKind::Runtime, "gloo: cannot write ", tmp, ": ", std::strerror(e));
    }
    p += k;
    n -= static_cast<size_t>(k);
  }
  ::close(fd);
  // rename is atomic: a reader sees no file or the whole value.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    throw_user(ErrorKind::Runtime, "gloo: cannot create ", path, ": ", std::strerror(e));
  }
}

bool FileStore::try_get(const std::string& key, std::vector<char>* value) {
  std::string path = path_of(key);
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    FJ_USER_CHECK(errno == ENOENT, ErrorKind::Runtime, "gloo: cannot read ", path, ": ",
                  std::strerror(errno));
    return false;
  }
  value->clear();
  char buf[1 << 14];
  for (;;) {
    ssize_t k = ::read(fd, buf, sizeof(buf));
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      int e = errno;
      ::close(fd);
      throw_user(ErrorKind::Runtime, "gloo: cannot read ", path, ": ", std::strerror(e));
    }
    if (k == 0) break;
    value->insert(value->end(), buf, buf + k);
  }
  ::close(fd);
  return true;
}

}  // namespace flowjit::runtime
