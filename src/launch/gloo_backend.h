#pragma once
// The only place that knows Gloo: a factory returning a plain c10d::Backend, so that nothing else
// in the project needs gloo's headers.

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace fsdp {

/// A Gloo backend over `store` for `size` ranks. The network device: GLOO_SOCKET_IFNAME if set,
/// loopback when `master_addr` is local, else this host's address on the route to `master_addr`.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& master_addr);

}  // namespace fsdp
