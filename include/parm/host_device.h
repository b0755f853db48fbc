// PARM_HD marks a function for both sides of a CUDA build (under nvcc: __host__ __device__;
// under g++: nothing), so that one definition serves the CPU code, the CUDA kernels and the
// CPU tests that check the kernels' maths. Includes no CUDA header.
#pragma once

#ifdef __CUDACC__
#define PARM_HD __host__ __device__
#else
#define PARM_HD
#endif
