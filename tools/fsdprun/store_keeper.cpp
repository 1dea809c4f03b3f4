// fsdp_store_keeper PORT: serves the job's c10d TCPStore on PORT (every address) until it is
// killed. fsdprun --fault-tolerant starts it, so that the store outlives every rank: a replica
// that loses a rank is replaced while the others keep their rendezvous (include/fsdp/replica_quorum.h).
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fsdp_store_keeper PORT\n";
    return 2;
  }
  char* end = nullptr;
  const long port = std::strtol(argv[1], &end, 10);
  if (*end != '\0' || port < 1 || port > 65535) {
    std::cerr << "fsdp_store_keeper: PORT must be in [1, 65535], got '" << argv[1] << "'\n";
    return 2;
  }
  try {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(port);
    options.isServer = true;
    options.waitWorkers = false;
    auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    for (;;) ::pause();  // until fsdprun stops it
  } catch (const std::exception& e) {
    std::cerr << "fsdp_store_keeper: cannot serve the store on port " << port << ": " << e.what() << "\n";
    return 1;
  }
}
