// tightfit/optim/optim.hpp: every optimizer header (update rules, schedules, partitions,
// orders, expansions, the block coordinate optimizer). checkpoint.hpp and train.hpp need
// tightfit::io (nlohmann-json) and are included separately.
#pragma once

#include "tightfit/optim/block_optimizer.hpp"
#include "tightfit/optim/expansion.hpp"
#include "tightfit/optim/order.hpp"
#include "tightfit/optim/partition.hpp"
#include "tightfit/optim/schedule.hpp"
#include "tightfit/optim/update_rules.hpp"
