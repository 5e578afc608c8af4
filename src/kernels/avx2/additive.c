/* The additive score's kernels (kernels/additive.h) at this folder's vector
 * width: 8 floats (-mavx2 -mfma). The code is kernels/additive_impl.h. */
#define ADD_VL 8
#define ADD_ISA avx2
#include "kernels/additive_impl.h"
