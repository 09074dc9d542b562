// A Communicator spanning several processes (and several devices in each),
// built on Gloo's TCP transport.
//
// Every process calls make_gloo_communicator once with the same
// num_processes, local_devices, address (or store directory) and tag, and
// its own process_rank. The global rank of local device d of process p is
// p * local_devices + d; with local_devices > 1 the devices are threads that
// share the one Communicator, each calling with its global rank.
//
// Results are those of make_thread_communicator(size()) bit for bit: every
// reduction adds in global rank order, and every rank gets the same bits.
//
// Failure: a peer that is unreachable, dies or stalls, or a process started
// with a different world size, makes the calls throw UserError(Runtime)
// within timeout_seconds, naming what happened; the communicator is then
// aborted (see runtime/comm/collective.h).
#pragma once

#include <memory>
#include <string>

#include "runtime/comm/collective.h"

namespace flowjit::runtime {

struct GlooOptions {
  int process_rank = 0, num_processes = 1, local_devices = 1;
  // The TCP rendezvous store is hosted by process 0 on master_addr:port (port
  // must be set when num_processes > 1). Every process also picks, for its
  // Gloo connections, the local interface that routes to master_addr.
  std::string master_addr = "127.0.0.1";
  int port = 0;
  // The job's secret for the TCP store (runtime/comm/tcp_store.h); empty: the
  // value of $FLOWJIT_STORE_TOKEN. Needed when num_processes > 1 over TCP.
  std::string store_token;
  std::string file_store_dir;   // non-empty: rendezvous through files here instead of TCP
  double timeout_seconds = 60;  // rendezvous and every collective
  std::string tag;              // key prefix, so several communicators can share a store
};

std::shared_ptr<Communicator> make_gloo_communicator(const GlooOptions& options);

}  // namespace flowjit::runtime
