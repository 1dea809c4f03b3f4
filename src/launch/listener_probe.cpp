#include "launch/listener_probe.h"

#include <c10/util/Exception.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <thread>

namespace fsdp {

namespace {

using AddressList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// The addresses of host:port; empty while the name service cannot answer yet (EAI_AGAIN).
AddressList resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int status = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  TORCH_CHECK(status == 0 || status == EAI_AGAIN, "MASTER_ADDR '", host, "' does not resolve (",
              ::gai_strerror(status), "): set MASTER_ADDR to the host name or address of rank 0's "
              "host");
  return AddressList(status == 0 ? found : nullptr, &::freeaddrinfo);
}

// A connection attempt that gives up by the deadline (a blocking connect to a host that does not
// answer would wait for the kernel's SYN retries, minutes).
bool connects(const addrinfo& address, std::chrono::steady_clock::time_point deadline) {
  const int fd = ::socket(address.ai_family, address.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                          address.ai_protocol);
  if (fd < 0) return false;
  bool ok = ::connect(fd, address.ai_addr, address.ai_addrlen) == 0;
  if (!ok && errno == EINPROGRESS) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd wait{fd, POLLOUT, 0};
    int error = 0;
    socklen_t size = sizeof error;
    ok = ::poll(&wait, 1, static_cast<int>(std::max<int64_t>(0, left.count()))) == 1 &&
         ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size) == 0 && error == 0;
  }
  ::close(fd);
  return ok;
}

}  // namespace

void wait_for_listener(const std::string& host, int port,
                       std::chrono::steady_clock::time_point deadline) {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(10);
  while (true) {
    const AddressList addresses = resolve(host, port);
    for (const addrinfo* a = addresses.get(); a != nullptr; a = a->ai_next) {
      if (connects(*a, deadline)) return;
    }
    const auto now = std::chrono::steady_clock::now();
    TORCH_CHECK(now < deadline, "nothing listens at ", host, ":", port, " after ",
                std::chrono::duration<double>(now - start).count(), " s (FSDP_TIMEOUT_SECONDS)");
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
}

}  // namespace fsdp
