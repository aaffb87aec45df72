// DSV4_HD marks small inline helpers usable from both host and CUDA device code.
#pragma once
#if defined(__CUDACC__)
#define DSV4_HD __host__ __device__ __forceinline__
#else
#define DSV4_HD inline
#endif
