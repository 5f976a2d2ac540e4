#pragma once
// Everything a training program needs, in one include.
#include "tandem/autograd/gradcheck.h"
#include "tandem/autograd/grad_mode.h"
#include "tandem/autograd/ops.h"
#include "tandem/core/device.h"
#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/random.h"
#include "tandem/core/tensor.h"
