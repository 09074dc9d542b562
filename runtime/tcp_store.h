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
// Every failure (no server, lost server, timeout) throws
// UserError(Runtime) with a message naming the store's address.
#pragma once

#include <chrono>
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
  TcpStore(const std::string& host, int port, bool host_server, std::chrono::milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& value) override;
  bool try_get(const std::string& key, std::vector<char>* value) override;
  std::string where() const override;
  int port() const { return port_; }  // the bound port when started with port 0

 private:
  void connect_until(std::chrono::steady_clock::time_point deadline);
  bool exchange(const std::vector<char>& msg, std::vector<char>* reply, std::string* err);
  void request(const std::vector<char>& msg, std::vector<char>* reply, const char* what);

  std::string host_;
  int port_;
  std::shared_ptr<TcpStoreServer> server_;
  int fd_ = -1;
  std::vector<std::vector<char>> sets_;  // this client's set requests, to replay on reconnect
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
