/* Shared by the MPI sources of src/dist (built only when CMake finds MPI,
 * which then defines QKV_HAVE_MPI for the library and its users). */
#ifndef QKV_DIST_INTERNAL_H
#define QKV_DIST_INTERNAL_H

#include "qkv.h"

#ifndef QKV_HAVE_MPI
#error "src/dist needs QKV_HAVE_MPI (CMake defines it when it finds MPI)"
#endif

#endif
