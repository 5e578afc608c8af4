/* The additive score's kernels (kernels/additive.h) at this folder's vector
 * width: 16 floats (-mavx512f and friends). The code is kernels/additive_impl.h. */
#define ADD_VL 16
#define ADD_ISA avx512
#include "kernels/additive_impl.h"
