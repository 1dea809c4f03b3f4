#pragma once
/// Naming ranks in backend errors: Gloo says which peer failed by its socket address.

#include <string>

namespace fsdp {

/// `message` (a backend error) with each Gloo peer address ("[127.0.0.1]:41234") followed by the
/// rank it belongs to ("(rank 1)"), as learnt when init_distributed connected the world group.
/// An address that is no rank's listening port (the far end of a connection a peer opened) is
/// left as is, and a note lists which port is which rank's. Unchanged before init_distributed.
///
/// Example:
///   catch (const c10::Error& e) { std::cerr << fsdp::name_peer_ranks(e.what_without_backtrace()); }
std::string name_peer_ranks(const std::string& message);

}  // namespace fsdp
