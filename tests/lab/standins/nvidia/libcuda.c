/* Stands in for NVIDIA's CUDA driver library libcuda.so.1 (package libnvidia-compute-*); lab only. */
typedef int CUresult;

CUresult cuInit(unsigned int flags) { (void)flags; return 0; }

CUresult cuDriverGetVersion(int *version)
{
    if (version == 0)
        return 1; /* CUDA_ERROR_INVALID_VALUE */
    *version = CUDA_DRIVER_API_VERSION;
    return 0;
}
