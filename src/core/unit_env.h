#pragma once
// What a unit (ParamGroup) works with, built once by the model (FsdpState) and handed to each of
// its units: the rate limiter, and how its gradients are reduced. Its collectives are objects of
// each flat group (unit_collectives.h). A unit calls nothing above it: what it has to say goes
// through UnitEvents (param_group.h).

#include "core/unit_comm.h"

namespace fsdp {

class RateLimiter;

struct UnitEnv {
  RateLimiter& limiter;
  ReduceSettings reduce;
};

}  // namespace fsdp
