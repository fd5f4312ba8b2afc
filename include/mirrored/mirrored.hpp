#pragma once
/// \file
/// Umbrella header of the mirrored library: `#include <mirrored/mirrored.hpp>`.

#include "mirrored/communication_options.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/data/dataset.hpp"
#include "mirrored/data/files.hpp"
#include "mirrored/device.hpp"
#include "mirrored/distributed_dataset.hpp"
#include "mirrored/distributed_values.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/input_options.hpp"
#include "mirrored/logging.hpp"
#include "mirrored/mirrored_strategy.hpp"
#include "mirrored/nn.hpp"
#include "mirrored/optimizers.hpp"
#include "mirrored/reduce_op.hpp"
#include "mirrored/replica_context.hpp"
#include "mirrored/strategy.hpp"
#include "mirrored/strategy_extended.hpp"
#include "mirrored/tensor.hpp"
#include "mirrored/variable.hpp"
