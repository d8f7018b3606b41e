/* gpu.h (internal): GPU discovery through the CUDA driver, loaded with dlopen at run time
 * so that the library and the agent run unchanged on CPU-only hosts. */
#ifndef TSP_GPU_H
#define TSP_GPU_H

#include "torchspark/common.h"

/* The number of CUDA devices this process can use (CUDA_VISIBLE_DEVICES applies, as for
 * torch.cuda.device_count()). 0 when no CUDA driver is installed. The driver library is
 * libcuda.so.1, or the path in TORCHSPARK_LIBCUDA. -EIO with err when the driver is
 * present but fails. The driver is loaded once per process and kept. */
int tsp_gpu_count(int *count, char *err, size_t errlen);

#endif
