// tightfit/optim/optim.hpp: every optimizer header (update rules, schedules, partitions,
// orders, expansions, the block coordinate optimizer, LoRA, ZeRO-1, the training loop and its
// callbacks, checkpoints through a TensorWriter / TensorReader). None of them needs
// tightfit::io. tests/support/check_umbrellas.cmake checks that it includes the whole folder.
#pragma once

#include "tightfit/optim/block_optimizer.hpp"
#include "tightfit/optim/callbacks.hpp"
#include "tightfit/optim/checkpoint.hpp"
#include "tightfit/optim/data_order.hpp"
#include "tightfit/optim/expansion.hpp"
#include "tightfit/optim/lora_optimizer.hpp"
#include "tightfit/optim/order.hpp"
#include "tightfit/optim/partition.hpp"
#include "tightfit/optim/schedule.hpp"
#include "tightfit/optim/train.hpp"
#include "tightfit/optim/update_rules.hpp"
#include "tightfit/optim/zero1.hpp"
