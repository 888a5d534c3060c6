/* Stands in for NVIDIA's NCCL library libnccl.so.2 (package libnccl2); lab only. */
/* Compiled together with the rendered nccl.h, which defines NCCL_VERSION_CODE. */

#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char last_error[256];

static void warn(const char *text)
{
    /* NCCL records the text for ncclGetLastError and prints it only when NCCL_DEBUG asks for
       warnings (src/debug.cc): "<host>:<pid>:<tid> [<dev>] NCCL WARN <text>". */
    const char *debug = getenv("NCCL_DEBUG");
    snprintf(last_error, sizeof last_error, "%s", text);
    if (debug && (!strcmp(debug, "WARN") || !strcmp(debug, "INFO") || !strcmp(debug, "TRACE"))) {
        char host[64] = "";
        gethostname(host, sizeof host - 1);
        fprintf(stderr, "%s:%d:%d [0] NCCL WARN %s\n", host, (int)getpid(), (int)getpid(), text);
    }
}

/* One entry of NCCL_SOCKET_IFNAME's list against an interface name: a prefix, or the whole
   name when the list starts with '=' (src/misc/utils.cc matchIfList / matchIf). */
static int matches(const char *name, const char *list, int exact)
{
    char copy[256];
    snprintf(copy, sizeof copy, "%s", list);
    for (char *save = 0, *item = strtok_r(copy, ",", &save); item; item = strtok_r(0, ",", &save)) {
        if (exact ? !strcmp(name, item) : !strncmp(name, item, strlen(item)))
            return 1;
    }
    return 0;
}

/* How many interfaces with an IPv4 or IPv6 (not link-local) address match `list`, the way
   ncclFindInterfaces reads NCCL_SOCKET_IFNAME: '^' excludes, '=' matches exactly. */
static int find_interfaces(const char *list)
{
    int exclude = list[0] == '^', exact;
    list += exclude;
    exact = list[0] == '=';
    list += exact;
    struct ifaddrs *all, *i;
    int found = 0;
    if (getifaddrs(&all) != 0)
        return 0;
    for (i = all; i; i = i->ifa_next) {
        if (!i->ifa_addr || (i->ifa_addr->sa_family != AF_INET && i->ifa_addr->sa_family != AF_INET6))
            continue;
        if (i->ifa_addr->sa_family == AF_INET6) {
            const unsigned char *a = ((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr.s6_addr;
            if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
                continue; /* link-local: skipped, as NCCL does */
        }
        if (matches(i->ifa_name, list, exact) != exclude)
            found++;
    }
    freeifaddrs(all);
    return found;
}

/* NCCL 2.14's ncclGetUniqueId runs bootstrapNetInit: with NCCL_SOCKET_IFNAME set, only the
   interfaces it names count; unset, "ib" interfaces first, then any but "docker" and "lo", then
   those (src/misc/socket.cc ncclFindInterfaces). None: src/bootstrap.cc warns "Bootstrap : no
   socket interface found" and returns ncclInternalError. The id itself carries nothing here. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    const char *env = getenv("NCCL_SOCKET_IFNAME");
    int found;
    if (uniqueId == 0)
        return ncclInvalidArgument;
    if (env && env[0])
        found = find_interfaces(env);
    else
        found = find_interfaces("ib") || find_interfaces("^docker,lo") || find_interfaces("docker")
                || find_interfaces("lo");
    if (!found) {
        warn("Bootstrap : no socket interface found");
        return ncclInternalError;
    }
    memset(uniqueId->internal, 0, sizeof uniqueId->internal);
    return ncclSuccess;
}

ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId) { return ncclGetUniqueId(uniqueId); }

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

const char *pncclGetLastError(ncclComm_t comm) { return ncclGetLastError(comm); }

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
