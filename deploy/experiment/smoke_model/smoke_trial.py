# mypy: ignore-errors
# (It runs in the task image, with the image's boto3, mpi4py or torch, not in the toolkit's venv.)
"""Verify's smoke trial (deploy/experiment/smoke.py submits it; hparam `smoke` picks the part).

Prints `SMOKE-OK <row>: ...` (in a two-container trial rank 0 does; the others print SMOKE-PART)
or exactly one `SMOKE-FAIL <row>: <what>` line. Parts: save, restore, allreduce (two agents,
mpirun over ssh), single (every slot of one agent, the ranks in one container). The S3 keys reach
this process in DET_EXPERIMENT_CONFIG and go to boto3 only: never printed.
"""

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid

SSH_DIR = "/run/determined/ssh"  # the master's per-trial key pair (master/pkg/tasks/const.go)
SSH_PORT = 12350  # determined.constants.DTRAIN_SSH_PORT: determined.launch.horovod's sshd
RENDEZVOUS = "/run/determined/info/rendezvous.json"  # determined/_info.py DEFAULT_RENDEZVOUS_INFO_PATH
RESULT = "/tmp/smoke-allreduce.json"
# Seconds rank 0 waits for the other containers' sshd. determined.launch.horovod gives it 20 s
# (util.check_sshd), after the harness's rendezvous has synchronised the containers' start; this
# trial has no such rendezvous, so the other container's start (an image pull) counts too.
SSHD_WAIT = 45
MPI_TIMEOUT = 60  # seconds for the whole mpirun: an allreduce of two numbers takes well under one
WORKER_WAIT = 150  # seconds a worker keeps sshd up for rank 0 (the master kills it sooner on failure)


def say(line):
    print(line, flush=True)


def fail(row, what):
    say(f"SMOKE-FAIL {row}: {' '.join(str(what).split())[:400]}")
    sys.exit(1)


def hparams():
    return json.loads(os.environ.get("DET_HPARAMS") or "{}")


def read_json(path):
    with open(path) as f:
        return json.load(f)


# --- CUDA --------------------------------------------------------------------------------

# cuda.h's names for what cuInit returns when the driver is there but CUDA cannot start.
CU_ERRORS = {
    100: "CUDA_ERROR_NO_DEVICE",
    802: "CUDA_ERROR_SYSTEM_NOT_READY (on NVSwitch systems: the fabric manager is not running)",
    803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (the kernel module and libcuda differ)",
}


def cuda(row):
    """What a trial's framework does first in a GPU container: initialise CUDA.

    libcuda.so.1 is the driver's, mounted by nvidia-container-cli; a container without it is a
    CPU task and this is skipped. The image's CUDA runtime (CUDA_VERSION, set by nvidia/cuda's
    and NGC's images) needs a driver of its major version or newer: CUDA's minor version
    compatibility covers 11.x on an 11.7 driver, not 12.x (CUDA Compatibility guide; forward
    compatibility needs the cuda-compat package and a datacenter driver branch it lists). The
    runtime's answer is cudaErrorInsufficientDriver, "CUDA driver version is insufficient for
    CUDA runtime version"; the smoke says the same, so a default image whose CUDA the driver
    cannot run turns every GPU row red, as it fails users' trials."""
    import ctypes

    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    host = socket.gethostname()
    code = lib.cuInit(0)
    if code != 0:
        fail(row, f"cuInit returned {code} {CU_ERRORS.get(code, '')} on {host}")
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        fail(row, f"cuDriverGetVersion failed on {host}")
    driver = (version.value // 1000, version.value % 1000 // 10)
    runtime = os.environ.get("CUDA_VERSION", "")
    m = re.match(r"(\d+)\.(\d+)", runtime)
    if m and int(m.group(1)) > driver[0]:
        fail(
            row,
            f"CUDA driver version is insufficient for CUDA runtime version: the image's CUDA "
            f"{runtime} on {host}, whose driver runs CUDA up to {driver[0]}.{driver[1]}",
        )


# --- checkpoints --------------------------------------------------------------------------


def s3_error(e):
    """The S3 error as S3 answered it, 'S3 <Code>: <Message>' (botocore's ClientError; boto3's
    upload_file wraps it in S3UploadFailedError, whose text carries the same)."""
    response = getattr(e, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        error = response["Error"]
        return f"S3 {error.get('Code')}: {error.get('Message') or '(no message)'}"
    m = re.search(r"An error occurred \((\w+)\) when calling the (\w+) operation: (.*)", str(e))
    if m:
        return f"S3 {m.group(1)}: {m.group(3)}"
    return f"{type(e).__name__}: {e}"


def bucket():
    """boto3 as Determined's S3StorageManager sets it up (harness/determined/common/storage/s3.py):
    boto3.resource("s3", endpoint_url, aws_access_key_id, aws_secret_access_key) from the
    experiment's checkpoint_storage, which the master merged with master.yaml's; the region from
    AWS_DEFAULT_REGION (task_container_defaults). Shorter timeouts than boto3's defaults, so that
    an endpoint that does not answer fails in seconds."""
    storage = json.loads(os.environ["DET_EXPERIMENT_CONFIG"])["checkpoint_storage"]
    import boto3
    from botocore.config import Config

    s3 = boto3.resource(
        "s3",
        endpoint_url=storage.get("endpoint_url"),
        aws_access_key_id=storage.get("access_key"),
        aws_secret_access_key=storage.get("secret_key"),
        config=Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2}),
    )
    s3.meta.client.meta.events.register("needs-retry.s3", _note_region_error)
    prefix = (storage.get("prefix") or "").strip("/")  # storage.normalize_prefix
    return s3.Bucket(storage["bucket"]), prefix, storage.get("endpoint_url")


# A request signed for another region than MinIO's is refused with AuthorizationHeaderMalformed,
# whose body names MinIO's region (<Region>, cmd/api-errors.go). botocore's S3 region redirector
# (botocore/utils.py S3RegionRedirectorv2, on the same needs-retry event) then signs the request
# again for that region, and the upload goes through: boto3 hides the mismatch that fails
# clients that do not follow (minio-py, the toolkit's own checks). The smoke wants the cluster's
# region to work as configured, so it notes the first refusal and reports it.
REGION_ERRORS = []


def _note_region_error(response=None, **kwargs):
    parsed = response[1] if isinstance(response, tuple) and len(response) > 1 else None
    error = (parsed or {}).get("Error") or {}
    if error.get("Code") == "AuthorizationHeaderMalformed" and not REGION_ERRORS:
        REGION_ERRORS.append(f"S3 AuthorizationHeaderMalformed: {error.get('Message')}")


def region_refused(row, what):
    """Fail when a request was refused for its region, although boto3 went on after it."""
    if REGION_ERRORS:
        signed = os.environ.get("AWS_DEFAULT_REGION") or "us-east-1 (boto3's default)"
        fail(
            row,
            f"{REGION_ERRORS[0]} Trials sign for {signed} (AWS_DEFAULT_REGION); boto3 signed again for "
            f"MinIO's region and went on, clients that do not follow fail ({what})",
        )


def where(prefix, storage_id):
    return "/".join(p for p in (prefix, storage_id) if p)  # S3StorageManager.get_storage_prefix


def save():
    row = "checkpoint-save"
    try:
        b, prefix, endpoint = bucket()
    except ImportError as e:
        fail(row, f"boto3 is not in the image: {e}")
    storage_id = str(uuid.uuid4())
    state = os.urandom(64 * 1024)
    metadata = {"sha256": hashlib.sha256(state).hexdigest(), "trial_id": os.environ.get("DET_TRIAL_ID")}
    base = where(prefix, storage_id)
    files = {"state.bin": state, "metadata.json": json.dumps(metadata).encode()}
    with tempfile.TemporaryDirectory() as d:
        for name in sorted(files):  # S3StorageManager.upload: bucket.upload_file per file
            path = os.path.join(d, name)
            with open(path, "wb") as f:
                f.write(files[name])
            try:
                b.upload_file(path, f"{base}/{name}")
            except Exception as e:
                fail(row, f"{s3_error(e)} (upload of s3://{b.name}/{base}/{name} to {endpoint})")
    region_refused(row, f"upload of s3://{b.name}/{base} to {endpoint}")
    region = b.meta.client.meta.region_name
    say(f"SMOKE-OK {row}: uuid={storage_id} s3://{b.name}/{base} (2 files, region {region})")


def restore():
    row = "checkpoint-restore"
    storage_id = hparams().get("restore_uuid")
    if not storage_id:
        fail(row, "no restore_uuid hyperparameter")
    try:
        b, prefix, endpoint = bucket()
    except ImportError as e:
        fail(row, f"boto3 is not in the image: {e}")
    base = where(prefix, storage_id)
    got = {}
    for name in ("metadata.json", "state.bin"):
        try:
            got[name] = b.Object(f"{base}/{name}").get()["Body"].read()
        except Exception as e:
            fail(row, f"{s3_error(e)} (download of s3://{b.name}/{base}/{name} from {endpoint})")
    region_refused(row, f"download of s3://{b.name}/{base} from {endpoint}")
    if hashlib.sha256(got["state.bin"]).hexdigest() != json.loads(got["metadata.json"])["sha256"]:
        fail(row, f"s3://{b.name}/{base}/state.bin: content differs from what the save trial wrote")
    say(f"SMOKE-OK {row}: uuid={storage_id} read back, sha256 matches")


# --- two agents: mpirun over ssh, an allreduce over the inter-node interface --------------


def interface():
    """The inter-node interface trials get: dtrain_network_interface (as the harness reads it),
    else the fabric variables master.yaml's task_container_defaults set."""
    for name in ("DET_INTER_NODE_NETWORK_INTERFACE", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if os.environ.get(name):
            return os.environ[name]
    return None


def check_interface(row, rank, ifname):
    """The inter-node interface up in this container (a multi-container trial runs on the host
    network: the node's own interfaces). A down port would only show as MPI's or NCCL's timeout
    minutes later; this says which node and which interface at once."""
    if not ifname:
        return
    states = {}
    for name in ifname.split(","):
        try:
            with open(f"/sys/class/net/{name}/operstate") as f:
                states[name] = f.read().strip()
        except OSError:
            states[name] = "missing"
    # "unknown": an interface whose driver reports no carrier state (up, e.g. a software one).
    if not any(state in ("up", "unknown") for state in states.values()):
        seen = ", ".join(f"{n} {s}" for n, s in states.items())
        fail(row, f"AllReduce would time out: container {rank} on {socket.gethostname()}: {seen}")


def mpi_rank():
    """One MPI rank (mpirun starts one in each container)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
    expected = comm.size * (comm.size + 1) // 2
    # Atomically: in the single-agent row every rank shares this container's /tmp, and the
    # two-agent worker waits for the file to appear.
    part = f"{RESULT}.{comm.rank}"
    with open(part, "w") as f:
        json.dump({"rank": comm.rank, "size": comm.size, "sum": total, "expected": expected}, f)
    os.replace(part, RESULT)
    say(f"SMOKE-RANK {comm.rank}/{comm.size} on {socket.gethostname()}: sum {total} (expected {expected})")


def sshd_config():
    """The master's sshd_config (master/static/srv/sshd_config, put beside the keys) or, where
    the cluster does not put one there, its settings."""
    shipped = os.path.join(SSH_DIR, "sshd_config")
    if os.path.exists(shipped):
        return shipped
    path = "/tmp/smoke-sshd_config"
    with open(path, "w") as f:
        f.write(
            f"HostKey {SSH_DIR}/id_rsa\nAuthorizedKeysFile {SSH_DIR}/authorized_keys\n"
            "PermitRootLogin prohibit-password\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
            "UsePAM no\nStrictModes yes\nPermitUserEnvironment yes\nAcceptEnv *\n"
        )
    return path


def worker(rank):
    """A non-chief container: sshd for rank 0's mpirun, as determined.launch.horovod runs it
    (/usr/sbin/sshd -p 12350 -f <config> -D), until this container's rank has allreduced."""
    row = "allreduce"
    if not os.path.exists("/usr/sbin/sshd"):
        fail(row, f"container {rank}: /usr/sbin/sshd is not in the image (openssh-server)")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-p", str(SSH_PORT), "-f", sshd_config(), "-D", "-e"])
    deadline = time.monotonic() + WORKER_WAIT
    while not os.path.exists(RESULT):
        if sshd.poll() is not None:
            fail(row, f"container {rank}: sshd exited {sshd.returncode} (its messages are above)")
        if time.monotonic() > deadline:
            sshd.terminate()
            fail(row, f"container {rank}: rank 0 never started an MPI rank here in {WORKER_WAIT}s")
        time.sleep(0.3)
    time.sleep(1)  # rank 0's mpirun sees this container's orted exit before sshd goes
    sshd.terminate()
    result = read_json(RESULT)
    if result["sum"] != result["expected"]:
        fail(row, f"container {rank}: allreduce sum {result['sum']}, expected {result['expected']}")
    say(f"SMOKE-PART {row}: container {rank} took part (sum {result['sum']})")  # rank 0 gives the verdict


def reachable(addr, deadline):
    """None once addr:SSH_PORT accepts a connection, else the last error at the deadline."""
    error = None
    while time.monotonic() < deadline:
        try:
            socket.create_connection((addr, SSH_PORT), timeout=2).close()
            return None
        except OSError as e:
            error = e
            time.sleep(0.5)
    return error


MPI_ERRORS = (
    "ssh:",
    "Permission denied",
    "Host key",
    "No route",
    "unreachable",
    "timed out",
    "refused",
    "ORTE was unable",
    "ORTE does not know",
    "WARNING: Open MPI failed",
    "Error",
    "error",
)


def mpi_error(text):
    """The line of mpirun's output that says what broke."""
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.startswith(("[hwloc", "SMOKE-"))]
    for key in MPI_ERRORS:
        for line in lines:
            if key in line:
                return line
    return lines[-1] if lines else "no output"


# TCP between the ranks (no verbs in a container without RDMA libraries' devices: the lab's;
# no shared-memory single-copy in a container without CAP_SYS_PTRACE), and none of the PSM/OFI
# transports Debian's build also carries.
MPI_TRANSPORT = ["-mca", "pml", "ob1", "-mca", "btl", "self,tcp", "-mca", "mtl", "^psm,psm2,ofi"]


def mpirun_or_fail(row):
    mpirun = shutil.which("mpirun") or shutil.which("mpirun.openmpi")
    if mpirun is None:
        fail(row, "mpirun is not in the image (openmpi-bin)")
    return mpirun


def run_mpirun(row, command, ifnames, ranks, timed_out, exited):
    """mpirun `command` (its options; the ranks run this file with SMOKE_MPI_RANK=1) on
    `ifnames` (MPI's byte and out-of-band traffic, as horovodrun --network-interface sets them),
    within MPI_TIMEOUT; fails the row with timed_out(error) / exited(status, error) and mpirun's
    line that says what broke, or checks the ranks' sum. Returns the allreduced sum."""
    if ifnames:
        joined = ",".join(ifnames)
        command = [*command, "-mca", "btl_tcp_if_include", joined, "-mca", "oob_tcp_if_include", joined]
    command = [
        *command,
        "-x",
        "SMOKE_MPI_RANK=1",
        "-x",
        "PYTHONUNBUFFERED=1",
        sys.executable,
        os.path.abspath(__file__),
    ]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=MPI_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as e:
        output = "".join(
            x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (e.stdout, e.stderr)
        )
        print(output, flush=True)
        fail(row, timed_out(mpi_error(output)))
    print(run.stdout + run.stderr, flush=True)
    if run.returncode != 0:
        fail(row, exited(run.returncode, mpi_error(run.stdout + run.stderr)))
    result = read_json(RESULT)
    if result["sum"] != result["expected"] or result["size"] != ranks:
        fail(row, f"allreduce of {result['size']} ranks gave {result['sum']}, expected {result['expected']}")
    return result["sum"]


def chief(addrs, ifname):
    row = "allreduce"
    deadline = time.monotonic() + SSHD_WAIT
    for i, addr in enumerate(addrs[1:], 1):
        error = reachable(addr, deadline)
        if error is not None:
            fail(
                row,
                f"AllReduce timeout: the sshd of container {i} at {addr}:{SSH_PORT} is not reachable "
                f"in {SSHD_WAIT}s: {error}",
            )
    mpirun = mpirun_or_fail(row)
    ssh = (
        f"-p {SSH_PORT} -i {SSH_DIR}/id_rsa -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
        "-o BatchMode=yes -o ConnectTimeout=10 -o LogLevel=ERROR"
    )
    command = [mpirun, "--allow-run-as-root", "-np", str(len(addrs))]
    command += ["-H", ",".join(f"{a}:1" for a in addrs), "--bind-to", "none", "--map-by", "slot"]
    command += ["-wdir", "/tmp", "-mca", "plm_rsh_agent", "ssh", "-mca", "plm_rsh_args", ssh, *MPI_TRANSPORT]
    total = run_mpirun(
        row,
        command,
        [ifname] if ifname else [],
        len(addrs),
        lambda error: f"AllReduce timeout: mpirun over {ifname} did not finish in {MPI_TIMEOUT}s ({error})",
        lambda status, error: f"mpirun over {ifname} exited {status}: {error}",
    )
    say(
        f"SMOKE-OK {row}: {len(addrs)} ranks on {','.join(addrs)} over {ifname} with Open MPI "
        f"(mpi4py): sum {total}"
    )


def gloo(addrs, rank, ifname):
    """No mpi4py in the image (a production image such as determinedai/pytorch-ngc): the same
    allreduce with torch.distributed's Gloo over the same interface. The lab's images carry
    mpi4py: the lab proves the MPI path only."""
    row = "allreduce"
    try:
        import datetime

        import torch
        import torch.distributed as dist
    except ImportError:
        fail(row, "neither mpi4py nor torch in the image: no collective library to try")
    if ifname:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", ifname)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://{addrs[0]}:29500",
            rank=rank,
            world_size=len(addrs),
            timeout=datetime.timedelta(seconds=MPI_TIMEOUT),
        )
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
    except Exception as e:
        fail(row, f"AllReduce timeout or error with Gloo over {ifname}: {e}")
    expected = len(addrs) * (len(addrs) + 1) // 2
    if int(t.item()) != expected:
        fail(row, f"Gloo allreduce gave {t.item()}, expected {expected}")
    verdict = "SMOKE-OK" if rank == 0 else "SMOKE-PART"
    say(f"{verdict} {row}: {len(addrs)} ranks on {','.join(addrs)} over {ifname} with Gloo: sum {expected}")


def allreduce():
    row = "allreduce"
    try:
        info = read_json(RENDEZVOUS)
    except (OSError, ValueError) as e:
        fail(row, f"no rendezvous information at {RENDEZVOUS}: {e}")
    # The agents' addresses as the master sees them (their management addresses); MPI is told
    # the fabric by interface name, as horovodrun --network-interface does.
    addrs, rank = info["container_addrs"], info["container_rank"]
    if len(addrs) < 2:
        fail(row, f"the trial got one container ({addrs}): it did not span two agents")
    if len(set(addrs)) < len(addrs):
        fail(row, f"the containers are on one node ({addrs}): the allreduce would not cross the fabric")
    ifname = interface()
    check_interface(row, rank, ifname)
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return gloo(addrs, rank, ifname)
    if rank == 0:
        chief(addrs, ifname)
    else:
        worker(rank)


# --- one agent: a rank per slot, the collective inside one node --------------------------

SINGLE_ROW = "single-agent-allreduce"
# The variables that name the collective's socket interface, and what each library answers when
# none of the container's interfaces fits: NCCL's bootstrap.cc bootstrapNetInit (WARN, then
# ncclInvalidUsage: ncclCommInitRank fails) and Gloo's gloo/transport/tcp/device.cc
# lookupAddrForIface (GLOO_ENFORCE: torch's init_process_group raises). Neither falls back to
# another interface, so a trial given an interface its container lacks fails at its first
# collective: the row reproduces that instead of trying whatever interface is there.
SOCKET_IFNAMES = (
    ("NCCL_SOCKET_IFNAME", "NCCL", "NCCL WARN Bootstrap : no socket interface found"),
    ("GLOO_SOCKET_IFNAME", "Gloo", "Unable to find address for: {name}"),
)
SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address


def addressed_interfaces():
    """The container's interfaces that have an address NCCL and Gloo would take (getifaddrs'
    AF_INET entries, AF_INET6 other than ::1): {name: running}. Read without getifaddrs, which
    Python does not wrap: SIOCGIFADDR for IPv4, /proc/net/if_inet6 for IPv6."""
    import fcntl
    import struct

    out = {}
    ipv6 = set()
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                fields = line.split()
                if len(fields) >= 6 and fields[0] != "0" * 31 + "1":
                    ipv6.add(fields[5])
    except OSError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                fcntl.ioctl(s.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
                has_v4 = True
            except OSError:  # EADDRNOTAVAIL: no IPv4 address
                has_v4 = False
            if has_v4 or name in ipv6:
                out[name] = operstate(name) in ("up", "unknown")
    return out


def operstate(name):
    try:
        with open(f"/sys/class/net/{name}/operstate") as f:
            return f.read().strip()
    except OSError:
        return "missing"


def nccl_matches(value, interfaces):
    """The interfaces NCCL_SOCKET_IFNAME selects (src/misc/socket.cc findInterfaces and
    matchIfList): a comma-separated list of name prefixes, `=` in front for exact names, `^`
    in front to exclude the list instead; ':port' after a name is ignored; only running
    interfaces with an address count."""
    exclude = value.startswith("^")
    value = value[1:] if exclude else value
    exact = value.startswith("=")
    value = value[1:] if exact else value
    wanted = [w.split(":")[0] for w in value.split(",") if w.split(":")[0]]

    def listed(name):
        return any(name == w if exact else name.startswith(w) for w in wanted)

    return [n for n, running in sorted(interfaces.items()) if running and listed(n) != exclude]


def gloo_missing(value, interfaces):
    """GLOO_SOCKET_IFNAME: torch's ProcessGroupGloo makes one device per comma-separated name,
    each an exact interface with an address; the first that has none fails."""
    return [n for n in value.split(",") if n and n not in interfaces]


def socket_interface_error(env, interfaces):
    """The collective's own error when the env names a socket interface the container lacks,
    with the variable and what the container has; None when every named one is there."""
    have = ", ".join(sorted(interfaces)) or "none"
    for var, library, text in SOCKET_IFNAMES:
        value = env.get(var)
        if not value:
            continue
        if var == "NCCL_SOCKET_IFNAME":
            if nccl_matches(value, interfaces):
                continue
            error = text
        else:
            missing = gloo_missing(value, interfaces)
            if not missing:
                continue
            error = text.format(name=missing[0])
        return f"{library}: {error} ({var}={value}; this container has {have})"
    return None


def single_interfaces(env, interfaces):
    """The interfaces the collective is told to use, for MPI's btl_tcp_if_include: NCCL's
    selection (else Gloo's names); None: none named, the library picks."""
    if env.get("NCCL_SOCKET_IFNAME"):
        return nccl_matches(env["NCCL_SOCKET_IFNAME"], interfaces)
    if env.get("GLOO_SOCKET_IFNAME"):
        return [n for n in env["GLOO_SOCKET_IFNAME"].split(",") if n]
    return None


def single_agent():
    """Every slot of one agent a rank in one container (Determined runs a trial that fits on
    one agent on Docker's bridge network: eth0 and lo only), the ranks allreduce inside it.
    DET_INTER_NODE_NETWORK_INTERFACE is not read: the harness's launchers use it between nodes
    only; inside one container NCCL and Gloo go by their own variables."""
    row = SINGLE_ROW
    try:
        info = read_json(RENDEZVOUS)
    except (OSError, ValueError) as e:
        fail(row, f"no rendezvous information at {RENDEZVOUS}: {e}")
    counts = info.get("container_slot_counts") or []
    if len(info.get("container_addrs") or []) != 1:
        fail(
            row,
            f"the trial got {len(info.get('container_addrs') or [])} containers: it did not fit on one agent",
        )
    ranks = int(counts[0]) if counts else 0
    if ranks < 2:
        fail(row, f"the trial's container got {ranks} slot(s): no collective between ranks to try")
    interfaces = addressed_interfaces()
    error = socket_interface_error(os.environ, interfaces)
    if error:
        fail(row, f"{error} on {socket.gethostname()}")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return single_gloo(ranks)
    single_mpi(ranks, single_interfaces(os.environ, interfaces))


def single_mpi(ranks, ifnames):
    row = SINGLE_ROW
    mpirun = mpirun_or_fail(row)
    # One rank per slot; --oversubscribe: the container may have fewer cores than slots.
    command = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "--bind-to", "none"]
    command += ["-wdir", "/tmp", *MPI_TRANSPORT]
    over = ",".join(ifnames) if ifnames else "the interfaces Open MPI picks"
    total = run_mpirun(
        row,
        command,
        ifnames,
        ranks,
        lambda error: (
            f"AllReduce timeout: {ranks} ranks over {over} did not finish in {MPI_TIMEOUT}s ({error})"
        ),
        lambda status, error: f"mpirun of {ranks} ranks over {over} exited {status}: {error}",
    )
    say(
        f"SMOKE-OK {row}: {ranks} ranks on {socket.gethostname()} over {over} with Open MPI "
        f"(mpi4py): sum {total}"
    )


def _gloo_rank(rank, ranks, port, results):
    import datetime

    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=ranks,
            timeout=datetime.timedelta(seconds=MPI_TIMEOUT),
        )
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        results.put((rank, int(t.item()), None))
    except Exception as e:
        results.put((rank, None, f"{type(e).__name__}: {e}"))


def single_gloo(ranks):
    """No mpi4py (a production image): torch.distributed's Gloo, one process per slot. Gloo
    reads GLOO_SOCKET_IFNAME itself (socket_interface_error has checked it already)."""
    row = SINGLE_ROW
    try:
        import multiprocessing

        import torch  # noqa: F401
    except ImportError:
        fail(row, "neither mpi4py nor torch in the image: no collective library to try")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_gloo_rank, args=(r, ranks, port, results)) for r in range(ranks)]
    for p in procs:
        p.start()
    got = []
    try:
        for _ in procs:
            got.append(results.get(timeout=MPI_TIMEOUT + 10))
    except Exception:
        fail(row, f"AllReduce timeout: {ranks} Gloo ranks did not finish in {MPI_TIMEOUT}s")
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
    errors = sorted(e for _, _, e in got if e)
    if errors:
        fail(row, f"Gloo: {errors[0]}")
    expected = ranks * (ranks + 1) // 2
    if any(total != expected for _, total, _ in got):
        fail(row, f"Gloo allreduce of {ranks} ranks did not give {expected}")
    say(f"SMOKE-OK {row}: {ranks} ranks on {socket.gethostname()} with Gloo: sum {expected}")


if __name__ == "__main__":
    if os.environ.get("SMOKE_MPI_RANK"):
        mpi_rank()
    else:
        parts = {"save": save, "restore": restore, "allreduce": allreduce, "single": single_agent}
        rows = {"save": "checkpoint-save", "restore": "checkpoint-restore", "allreduce": "allreduce"}
        part = hparams()["smoke"]
        cuda(rows.get(part, SINGLE_ROW))
        parts[part]()
