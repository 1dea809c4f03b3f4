#pragma once
// The only place that knows Gloo: a factory returning a plain c10d::Backend, so that nothing else
// in the project needs gloo's headers.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fsdp {

/// A Gloo backend over `store` for `size` ranks. The network device: `socket_interface` if not
/// empty (GLOO_SOCKET_IFNAME), loopback when `master_addr` is local, else this host's address on
/// the route to `master_addr`.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& master_addr,
                                                    const std::string& socket_interface);

/// Where a rank's Gloo listens, as its full-mesh rendezvous publishes it.
struct GlooListeningAddress {
  int port = 0;
  std::string ipv4;  ///< dotted quad; empty for an IPv6 address
};

/// Parses the value Gloo's full-mesh rendezvous writes under "0/RANK" in the group's store.
/// Gloo offers no reader for it: the serialized sockaddr is searched at the offsets of torch
/// 2.13's layout (its family, AF_INET or AF_INET6, at byte 16 to 24, then the port and the IPv4
/// address). A blob without one throws, saying the layout is not the one this build knows.
GlooListeningAddress parse_gloo_listening_address(const std::vector<uint8_t>& blob);

}  // namespace fsdp
