#pragma once
/// @file
/// Checkpoint planners: pure functions from a description of a chain of layers (a Chain) to a
/// Plan (which layers to put in which, possibly nested, checkpoint segments), each plan carrying
/// its predicted peak memory and recompute cost. No tape is needed: a Chain can be written by
/// hand, or measured by plan::profile() (checkpoint/profile.hpp).
///
/// One header per concept, all included here:
/// - plan/chain.hpp      Chain, Segment, Plan (and Kind, format_bytes);
/// - plan/simulator.hpp  predict(), the simulation every planner optimizes (Note [memory
///                       model]), and custom(), none(), every(), sqrt();
/// - plan/optimal.hpp    optimal(): binomial nested plans for a number of checkpoint slots;
/// - plan/budget.hpp     budget(): the least recompute under a byte budget;
/// - plan/frontier.hpp   frontier(): the Pareto points (peak, recompute) of a chain.

#include "remat/checkpoint/plan/budget.hpp"
#include "remat/checkpoint/plan/chain.hpp"
#include "remat/checkpoint/plan/frontier.hpp"
#include "remat/checkpoint/plan/optimal.hpp"
#include "remat/checkpoint/plan/simulator.hpp"
