#pragma once
// What a unit (ParamGroup) works with, built once by the model (FsdpState) and handed to each of
// its units: the rate limiter, the step's conductor, and how its gradients are reduced. Its
// collectives are objects of each flat group (unit_collectives.h). A unit calls nothing above it:
// what it has to say goes to the conductor below it or through UnitEvents (param_group.h).

#include "core/unit_comm.h"

namespace fsdp {

class RateLimiter;
class StepConductor;

struct UnitEnv {
  RateLimiter& limiter;
  /// The step's order of events: the unit reports its backward reached and its gradient ready.
  StepConductor& conductor;
  ReduceSettings reduce;
};

}  // namespace fsdp
