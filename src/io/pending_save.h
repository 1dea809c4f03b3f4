#pragma once
// [Note: one save at a time]
// An asynchronous save (include/fsdp/async_checkpoint.h) is this process's pending save until
// its wait() completes it. Every save starts by completing the pending one (a collective: every
// rank reaches the next save at the same step boundary), so two saves never write at once and
// their `latest` pointers are published in order.

namespace fsdp::detail {

/// Completes the pending asynchronous save, if any (its wait(); rethrows its error).
void wait_for_pending_save();

}  // namespace fsdp::detail
