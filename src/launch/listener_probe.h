#pragma once
// Waiting for rank 0's rendezvous store to listen, within one deadline.
//
// c10d's TCPStore client, asked to connect to a port nobody listens on, retries for its whole
// timeout, then retries once more for another whole timeout, logging each failure with a C++
// backtrace. Probing with a plain socket first keeps the wait inside the caller's deadline and the
// failure to one message; the store is constructed only once something listens.

#include <chrono>
#include <string>

namespace fsdp {

/// Returns once a TCP connection to `host`:`port` succeeds (and closes it again). Throws, naming
/// the address, when the deadline passes first, or at once when `host` does not resolve.
void wait_for_listener(const std::string& host, int port,
                       std::chrono::steady_clock::time_point deadline);

}  // namespace fsdp
