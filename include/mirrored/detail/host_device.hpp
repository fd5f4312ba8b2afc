#pragma once
// MIRRORED_HOST_DEVICE marks a function that runs on the host and, under nvcc, on a GPU too: the
// optimizer formulas (optimizer_formulas.hpp) and the CUDA kernels' index arithmetic are compiled
// for both from one definition. Every other compiler sees a plain function.

#if defined(__CUDACC__)
#define MIRRORED_HOST_DEVICE __host__ __device__
#else
#define MIRRORED_HOST_DEVICE
#endif
