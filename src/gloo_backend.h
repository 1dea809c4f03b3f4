#pragma once
// The only place that knows Gloo: a factory returning a plain c10d::Backend, so that nothing else
// in the project needs gloo's headers.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace fsdp {

/// A Gloo backend over `store` for `size` ranks. `hostname` picks the network device: the
/// loopback address for a single machine, otherwise GLOO_SOCKET_IFNAME or this host's name.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& hostname);

}  // namespace fsdp
