#pragma once
/// fsdp-cpp: fully sharded data parallel training for LibTorch. Include this one header.

#include <fsdp/auto_wrap.h>
#include <fsdp/async_checkpoint.h>
#include <fsdp/checkpoint.h>
#include <fsdp/clip.h>
#include <fsdp/comm_stats.h>
#include <fsdp/device_mesh.h>
#include <fsdp/distributed.h>
#include <fsdp/fully_shard.h>
#include <fsdp/fused_adamw.h>
#include <fsdp/fused_sgd.h>
#include <fsdp/grad_scaler.h>
#include <fsdp/memory.h>
#include <fsdp/muon.h>
#include <fsdp/options.h>
#include <fsdp/parallelize.h>
#include <fsdp/plan.h>
#include <fsdp/replica_quorum.h>
#include <fsdp/state_dict.h>
#include <fsdp/summon_full_params.h>
#include <fsdp/tensor_parallel.h>
