#pragma once
/// \file
/// The variable-level part of `StrategyExtended`: `update`, `reduce_to`, `batch_reduce_to`,
/// `variable_created_in_scope`. Declared and defined in <mirrored/strategy.hpp>; this header
/// adds <mirrored/variable.hpp>, which a caller of them needs for its variables anyway.

#include "mirrored/strategy.hpp"
#include "mirrored/variable.hpp"
