/* Stands in for NVIDIA's NCCL library libnccl.so.2 (package libnccl2); lab only. */
/* Compiled together with the rendered nccl.h, which defines NCCL_VERSION_CODE. */

ncclResult_t ncclGetVersion(int *version)
{
    if (version == 0)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t pncclGetVersion(int *version) { return ncclGetVersion(version); }

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *pncclGetErrorString(ncclResult_t result) { return ncclGetErrorString(result); }
