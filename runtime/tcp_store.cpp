// The rendezvous stores of runtime/tcp_store.h: the TCP server and client,
// and the directory store.
//
// Wire format of the TCP store, integers little-endian:
//   set:  'S' u32 key_len key u64 value_len value  ->  'K'
//   get:  'G' u32 key_len key                      ->  'N' | 'V' u64 value_len value
// A get never waits on the server; waiting is polling on the client, which
// keeps the server a plain single-threaded request/response loop.
#include "runtime/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
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

namespace flowjit::runtime {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxKeyBytes = 64 << 10;
constexpr uint64_t kMaxValueBytes = uint64_t{256} << 20;

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
// TcpStoreServer: a thread polling the listening socket, its connections and
// a pipe that tells it to stop.

class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port) {
    AddrInfo ai;
    int rv = resolve(host, port, false, &ai);
    FJ_USER_CHECK(rv == 0, ErrorKind::Runtime, "gloo: cannot resolve the rendezvous address ", host,
                  ": ", gai_strerror(rv));
    std::string err = "no address";
    for (addrinfo* a = ai.list; a && listen_fd_ < 0; a = a->ai_next) {
      int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
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
    int fd;
    std::vector<char> in;  // received bytes not yet parsed
  };

  void run() {
    std::vector<Conn> conns;
    for (;;) {
      std::vector<pollfd> fds{{wake_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
      for (const auto& c : conns) fds.push_back({c.fd, POLLIN, 0});
      int rv = ::poll(fds.data(), fds.size(), -1);
      if (rv < 0 && errno == EINTR) continue;
      if (rv < 0 || fds[0].revents) break;
      std::vector<Conn> alive;
      for (size_t i = 0; i < conns.size(); ++i) {
        Conn& c = conns[i];
        if (fds[i + 2].revents && !receive(c)) {
          ::close(c.fd);
          continue;
        }
        alive.push_back(std::move(c));
      }
      conns = std::move(alive);
      if (fds[1].revents & POLLIN) {
        int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          set_nodelay(fd);
          // A client that stops reading must not stall the server for good.
          timeval tv{10, 0};
          setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
          conns.push_back({fd, {}});
        }
      }
    }
    for (const auto& c : conns) ::close(c.fd);
  }

  // Reads what is there and answers every complete request; false drops the
  // connection (closed by the client, or a malformed request).
  bool receive(Conn& c) {
    char buf[1 << 16];
    ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
    if (n < 0 && errno == EINTR) return true;
    if (n <= 0) return false;
    c.in.insert(c.in.end(), buf, buf + n);
    size_t done = 0;
    for (;;) {
      Reader r(c.in.data() + done, c.in.size() - done);
      uint8_t op;
      uint32_t klen;
      const char* key;
      if (!r.u8(&op)) break;
      if (op != 'S' && op != 'G') return false;
      if (!r.u32(&klen)) break;
      if (klen > kMaxKeyBytes) return false;
      if (!r.bytes(klen, &key)) break;
      std::vector<char> reply;
      if (op == 'S') {
        uint64_t vlen;
        const char* value;
        if (!r.u64(&vlen)) break;
        if (vlen > kMaxValueBytes) return false;
        if (!r.bytes(vlen, &value)) break;
        data_[std::string(key, klen)] = std::vector<char>(value, value + vlen);
        reply.push_back('K');
      } else {
        auto it = data_.find(std::string(key, klen));
        if (it == data_.end()) {
          reply.push_back('N');
        } else {
          reply.push_back('V');
          put_u64(reply, it->second.size());
          reply.insert(reply.end(), it->second.begin(), it->second.end());
        }
      }
      if (!send_all(c.fd, reply.data(), reply.size())) return false;
      done += r.consumed();
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(done));
    return true;
  }

  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
  std::map<std::string, std::vector<char>> data_;  // touched by the server thread only
};

namespace {

// The servers this process hosts, by address, so that communicators created
// with the same master address and port share one (a second bind would fail).
std::shared_ptr<TcpStoreServer> acquire_server(const std::string& host, int port) {
  if (port == 0) return std::make_shared<TcpStoreServer>(host, port);
  static std::mutex mu;
  static auto* servers = new std::map<std::string, std::weak_ptr<TcpStoreServer>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*servers)[host + ":" + std::to_string(port)];
  if (auto s = slot.lock()) return s;
  auto s = std::make_shared<TcpStoreServer>(host, port);
  slot = s;
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------
// TcpStore

TcpStore::TcpStore(const std::string& host, int port, bool host_server, milliseconds timeout)
    : RendezvousStore(timeout), host_(host), port_(port) {
  if (host_server) {
    server_ = acquire_server(host, port);
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
    if (fd_ >= 0) return;
    if (Clock::now() >= deadline) break;
    // The hosting process may not be up yet: retry until the deadline.
    std::this_thread::sleep_for(milliseconds(std::min(50, std::max(1, remaining_ms(deadline)))));
  }
  throw_user(ErrorKind::Runtime, "gloo: could not reach the rendezvous store at ", where(),
             " within ", seconds_text(timeout()), " (is process 0 running?): ", err);
}

// Sends `msg` and reads the reply (its first byte, and for 'V' the value).
// False when the connection is gone; throws when the server does not answer.
bool TcpStore::exchange(const std::vector<char>& msg, std::vector<char>* reply, std::string* err) {
  if (!send_all(fd_, msg.data(), msg.size())) {
    *err = std::strerror(errno);
    return false;
  }
  auto deadline = Clock::now() + timeout();
  auto read_exact = [&](char* p, size_t n) {
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
  };
  char tag;
  if (!read_exact(&tag, 1)) return false;
  reply->assign(1, tag);
  if (tag == 'V') {
    char len[8];
    if (!read_exact(len, 8)) return false;
    uint64_t n = get_le(len, 8);
    if (n > kMaxValueBytes) {
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
  if (fd_ >= 0 && exchange(msg, reply, &err)) return;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  // Our own server cannot have gone; anyone else's may have been replaced.
  if (!server_) {
    try {
      connect_until(Clock::now() + timeout());
    } catch (const UserError&) {
      // Report the loss, not the failed retry.
    }
    bool ok = fd_ >= 0;
    std::vector<char> ignored;
    for (size_t i = 0; ok && i < sets_.size(); ++i) ok = exchange(sets_[i], &ignored, &err);
    if (ok && exchange(msg, reply, &err)) return;
  }
  throw_user(ErrorKind::Runtime, "gloo: lost the connection to the rendezvous store at ", where(),
             " during ", what, " (did process 0 exit?): ", err);
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  std::vector<char> msg, reply;
  put_key(msg, 'S', key);
  put_u64(msg, value.size());
  msg.insert(msg.end(), value.begin(), value.end());
  request(msg, &reply, "set");
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
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST)
      throw_user(ErrorKind::Runtime, "gloo: cannot create the file store directory ", prefix, ": ",
                 std::strerror(errno));
  }
  struct stat st;
  FJ_USER_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), ErrorKind::Runtime,
                "gloo: the file store path ", dir, " is not a directory");
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
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
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
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
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
