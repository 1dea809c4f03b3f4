// Compiled with USE_C10D_GLOO (see src/CMakeLists.txt); gloo's headers come from Debian's
// libgloo-dev, its code from libtorch_cpu.
#include "launch/gloo_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <c10/util/Exception.h>

namespace fsdp {

namespace {

bool is_loopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// This host's address on the route to `master` (IPv4): a UDP socket "connected" there sends
// nothing, but the kernel picks the source address it would use. Empty if there is no route.
std::string local_address_towards(const std::string& master) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(master.c_str(), "9", &hints, &found) != 0 || found == nullptr) return "";
  std::string address;
  const int fd = socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in local{};
  socklen_t length = sizeof(local);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
    char text[INET_ADDRSTRLEN] = {};
    if (inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text))) address = text;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return address;
}

// The interface Gloo listens on and advertises to its peers: the one the user names
// (GLOO_SOCKET_IFNAME, as in PyTorch), loopback for a local job, else the address this host
// reaches the master from. (PyTorch's default, the address the host name resolves to, is often
// 127.0.0.1 in containers and network namespaces: every peer would then try to connect to itself.)
std::shared_ptr<::gloo::transport::Device> make_device(const std::string& master,
                                                       const std::string& socket_interface) {
  if (!socket_interface.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(socket_interface);
  }
  if (is_loopback(master)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  const std::string local = local_address_towards(master);
  if (!local.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(local);
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout,
                                                    const std::string& master_addr,
                                                    const std::string& socket_interface) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  options->devices.push_back(make_device(master_addr, socket_interface));
  options->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
}

GlooListeningAddress parse_gloo_listening_address(const std::vector<uint8_t>& blob) {
  for (size_t at = 16; at + 8 <= blob.size() && at <= 24; at += 2) {
    const bool inet = (blob[at] == AF_INET || blob[at] == AF_INET6) && blob[at + 1] == 0;
    const int port = blob[at + 2] << 8 | blob[at + 3];
    if (!inet || port == 0) continue;
    GlooListeningAddress address;
    address.port = port;
    char text[INET_ADDRSTRLEN] = {};
    if (blob[at] == AF_INET && inet_ntop(AF_INET, &blob[at + 4], text, sizeof(text))) {
      address.ipv4 = text;
    }
    return address;
  }
  TORCH_CHECK(false, "Gloo's rendezvous address (", blob.size(), " bytes) is not in the layout "
              "this build knows (torch 2.13's: a socket address whose family is at byte 16 to "
              "24); this LibTorch's Gloo serializes it otherwise");
}

}  // namespace fsdp
