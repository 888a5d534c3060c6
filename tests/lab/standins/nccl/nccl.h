/* Stands in for NVIDIA's nccl.h (package libnccl-dev @DEB_VERSION@); lab only. */
#ifndef NCCL_H_
#define NCCL_H_

#define NCCL_MAJOR @MAJOR@
#define NCCL_MINOR @MINOR@
#define NCCL_PATCH @PATCH@
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE @CODE@
#define NCCL_VERSION(X, Y, Z) (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;
typedef struct ncclComm *ncclComm_t;

/* Generates an Id to be used in ncclCommInitRank; it bootstraps over the socket interface
   NCCL_SOCKET_IFNAME names (find or fail). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId);

/* The last error NCCL recorded, as a human-readable string. */
const char *ncclGetLastError(ncclComm_t comm);
const char *pncclGetLastError(ncclComm_t comm);

/* Return the NCCL_VERSION_CODE of the NCCL library in the supplied integer. */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t pncclGetVersion(int *version);

/* Returns a string for each error code. */
const char *ncclGetErrorString(ncclResult_t result);
const char *pncclGetErrorString(ncclResult_t result);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
