#pragma once
// Device-neutral kernels: the non-differentiable compute layer under autograd, one header per op
// family. Each function checks its arguments, allocates the output, and hands contiguous or
// strided views to the backend of the inputs' device (core/cpu/ or core/cuda/, see
// core/backend.h). This header brings in every family.
#include "tandem/core/attention.h"
#include "tandem/core/conv.h"
#include "tandem/core/copy.h"
#include "tandem/core/elementwise.h"
#include "tandem/core/index.h"
#include "tandem/core/layer_norm.h"
#include "tandem/core/linear.h"
#include "tandem/core/matmul.h"
#include "tandem/core/optim.h"
#include "tandem/core/reduce.h"
#include "tandem/core/softmax.h"
