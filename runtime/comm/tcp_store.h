// Rendezvous stores for the Gloo communicator: a small key-value store the
// processes of a job use once, at start-up, to find each other.
//
// The Debian gloo has no TCPStore, so this file provides one: process 0
// hosts a server thread and every process (process 0 included) talks to it
// over TCP. A store backed by a shared directory is the alternative when no
// process can listen on a port. Both implement gloo::rendezvous::Store, so
// gloo's own connectFullMesh can use them, and add try_get/check for callers
// that want to poll and report exactly which keys are missing.
//
// The TCP store trusts no one who reaches its port:
//  * Every connection first proves that it knows the job's token
//    (kStoreTokenEnv, the same secret in every process of a job; `python -m
//    flowjit.launch` makes one) without sending it: the server opens with a
//    fresh random nonce, the client answers with its own nonce and
//    HMAC-SHA256(token, "flowjit-store-v1 client" || server nonce || client
//    nonce), and the server, having compared that in constant time, proves
//    itself with the same MAC over "flowjit-store-v1 server" (mutual: a
//    client never talks to a server that does not know the token). The
//    server serves nothing, not even a get, before the proof matches; a
//    wrong one is refused with a message and the connection closed. An
//    answer is bound to its nonces, so a recorded exchange replayed to
//    another connection is refused, and an eavesdropper learns neither the
//    token nor anything that lets it connect. What follows the handshake is
//    neither encrypted nor authenticated per message: the store's keys and
//    values (the processes' addresses) can be read on the network, and
//    someone who can alter the TCP stream can alter them (bind to a private
//    network, docs: README "Several machines").
//  * Keys, values, the number of keys and the bytes held are capped
//    (TcpStoreLimits); a request over a cap is refused before its payload
//    is read, so nothing is allocated for it.
//  * One thread serves every connection with non-blocking sockets: a client
//    that sends half a request or never reads its replies delays no one, and
//    is closed after idle_timeout (hello_timeout before it has proved it
//    knows the token). A client whose connection was closed reconnects.
//
// Every failure (no server, lost server, timeout, refusal) throws
// UserError(Runtime) with a message naming the store's address.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace flowjit::runtime {

class RendezvousStore : public gloo::rendezvous::Store {
 public:
  explicit RendezvousStore(std::chrono::milliseconds timeout) : timeout_(timeout) {}

  // Where the store is, for messages: "127.0.0.1:29500", "file store /tmp/x".
  virtual std::string where() const = 0;
  // The value of `key` if it is set now; never waits.
  virtual bool try_get(const std::string& key, std::vector<char>* value) = 0;
  // Whether every key is set now.
  virtual bool check(const std::vector<std::string>& keys);

  // Waits up to the store's timeout for the key, then returns its value.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::chrono::milliseconds timeout_;
};

// The environment variable that carries the job's rendezvous token, and
// its accepted lengths. Launchers set it to 64 random hex digits
// (flowjit.env.new_store_token()).
inline constexpr const char* kStoreTokenEnv = "FLOWJIT_STORE_TOKEN";
inline constexpr size_t kMinStoreTokenBytes = 16;
inline constexpr size_t kMaxStoreTokenBytes = 1024;

// The handshake's nonces and MACs (tcp_store.cpp's wire format).
inline constexpr size_t kStoreNonceBytes = 32;
inline constexpr size_t kStoreMacBytes = 32;
// HMAC-SHA256(token, "flowjit-store-v1 <role>" || server_nonce ||
// client_nonce): what the client ("client") and then the server ("server")
// send to prove they know the token.
std::string store_proof(const std::string& token, const char* role, const std::string& server_nonce,
                        const std::string& client_nonce);
// `n` bytes from the kernel's random source (getrandom).
std::string random_bytes(size_t n);

// `token`, or when empty the value of $FLOWJIT_STORE_TOKEN; throws a
// UserError(Value) saying how to set one when neither is there or the token
// is shorter than kMinStoreTokenBytes or longer than kMaxStoreTokenBytes.
std::string resolve_store_token(const std::string& token);

// What the TCP store's server accepts and how long it waits.
struct TcpStoreLimits {
  size_t max_key_bytes = 4096;
  uint64_t max_value_bytes = uint64_t{16} << 20;
  size_t max_keys = size_t{1} << 20;
  uint64_t max_total_bytes = uint64_t{1} << 30;  // keys and values held
  size_t max_connections = 4096;
  // Connections that have not presented the token yet; when one more
  // arrives, the oldest of them is closed.
  size_t max_unauthenticated = 64;
  // A connection that sends nothing for this long (with half a request
  // received, or none) is closed; before the token, hello_timeout applies.
  std::chrono::milliseconds idle_timeout{60000};
  std::chrono::milliseconds hello_timeout{10000};
};

class TcpStoreServer;

// A client of the TCP store at host:port. With `host_server`, first starts the
// server on that address in this process (or joins the one this process
// already runs there, so several communicators can share one port); without,
// retries connecting until the timeout, since the hosting process may start
// later. A client that loses its server reconnects once (within the timeout)
// and sets its keys again: the host may have been serving an earlier
// communicator on the same port and now serve the next one.
class TcpStore final : public RendezvousStore {
 public:
  // `token`: the job's shared secret (see resolve_store_token). `limits`
  // apply to the server this client starts; a joined server keeps its own.
  TcpStore(const std::string& host, int port, bool host_server, std::chrono::milliseconds timeout,
           const std::string& token, const TcpStoreLimits& limits = {});
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& value) override;
  bool try_get(const std::string& key, std::vector<char>* value) override;
  std::string where() const override;
  int port() const { return port_; }  // the bound port when started with port 0

 private:
  void connect_until(std::chrono::steady_clock::time_point deadline);
  bool hello(std::string* err);
  bool read_exact(char* p, size_t n, std::chrono::steady_clock::time_point deadline,
                  std::string* err);
  bool exchange(const std::vector<char>& msg, std::vector<char>* reply, std::string* err,
                const char* what);
  void request(const std::vector<char>& msg, std::vector<char>* reply, const char* what);

  std::string host_;
  int port_;
  std::string token_;
  uint64_t max_value_bytes_;
  std::shared_ptr<TcpStoreServer> server_;
  int fd_ = -1;
  std::vector<std::vector<char>> sets_;  // this client's set requests, to replay on reconnect
};

// The server's side of one connection, without sockets (the server and the
// fuzzer drive it): bytes in, replies out, against a map shared by every
// connection of one server. Not thread-safe; the server has one thread.
class StoreProtocol {
 public:
  // `nonces`: makes each session's server nonce (random_bytes by default;
  // the fuzzer's is deterministic).
  using NonceSource = std::function<std::string()>;
  StoreProtocol(std::string token, TcpStoreLimits limits, NonceSource nonces = {})
      : token_(std::move(token)), limits_(limits), nonces_(std::move(nonces)) {}

  class Session {
   public:
    explicit Session(StoreProtocol& store);
    // The server's opening ('C' and the nonce), to send on connect.
    void greet(std::vector<char>* out) const;
    const std::string& nonce() const { return nonce_; }
    // Consumes `n` received bytes and appends the replies to *out. False:
    // close the connection once *out is sent (a refusal, a malformed or
    // oversized request); the session is then spent.
    bool feed(const char* p, size_t n, std::vector<char>* out);
    // Answers requests already received. feed() stops answering once about
    // a megabyte of replies is queued (backlog() then says so): send those,
    // then call resume().
    bool resume(std::vector<char>* out);
    bool backlog() const { return backlog_; }
    bool authenticated() const { return authenticated_; }

   private:
    bool step(const char* p, size_t n, std::vector<char>* out, size_t* used);
    StoreProtocol& store_;
    std::string nonce_;     // this session's server nonce
    std::vector<char> in_;  // received bytes not yet answered
    bool authenticated_ = false, closed_ = false, backlog_ = false;
  };

  size_t keys() const { return data_.size(); }
  uint64_t bytes() const { return bytes_; }
  const TcpStoreLimits& limits() const { return limits_; }

 private:
  friend class Session;
  std::string token_;
  TcpStoreLimits limits_;
  NonceSource nonces_;
  std::map<std::string, std::vector<char>> data_;
  uint64_t bytes_ = 0;  // keys and values in data_
};

// Gloo publishes each pair's address as the raw bytes of its
// gloo::transport::tcp::Address, a sockaddr_storage filled by getsockname()
// into an uninitialised variable, then a sequence number: past the
// sockaddr_in (or _in6) proper, 100-odd bytes of gloo's stack went to every
// process that could read the store. This store forwards to another and
// zeroes those bytes in the address lists gloo sets (all-digit keys whose
// values are whole addresses), leaving every other value as it is.
class ScrubbedAddressStore final : public gloo::rendezvous::Store {
 public:
  explicit ScrubbedAddressStore(gloo::rendezvous::Store& inner) : inner_(inner) {}
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override { return inner_.get(key); }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }
  // Zeroes the unused tail of every address in `value` (a whole number of
  // gloo addresses); returns false and leaves it alone otherwise.
  static bool scrub(std::vector<char>& value);

 private:
  gloo::rendezvous::Store& inner_;
};

// A store in a directory shared by every process (a local or network file
// system): one file per key, written to a temporary name and renamed so that
// readers never see half a value. The directory should be fresh for each job
// (or each job should use its own tag): keys left by an earlier job are
// indistinguishable from this job's.
class FileStore final : public RendezvousStore {
 public:
  FileStore(const std::string& dir, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<char>& value) override;
  bool try_get(const std::string& key, std::vector<char>* value) override;
  std::string where() const override { return "file store " + dir_; }

 private:
  std::string path_of(const std::string& key) const;

  std::string dir_;
};

}  // namespace flowjit::runtime
