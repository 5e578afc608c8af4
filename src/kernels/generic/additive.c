/* The additive score's kernels (kernels/additive.h) at this folder's vector
 * width: 4 floats (base flags (SSE2 on x86-64)). The code is kernels/additive_impl.h. */
#define ADD_VL 4
#define ADD_ISA generic
#include "kernels/additive_impl.h"
