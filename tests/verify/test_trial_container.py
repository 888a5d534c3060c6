"""What a Determined trial container gets on each agent, tried with Docker the way the agent
starts one.

- The GPU image the master hands trials (the deployed master.yaml's
  task_container_defaults.image.cuda) must run on the node's driver: libnvidia-container
  refuses an image whose NVIDIA_REQUIRE_CUDA the driver does not meet (src/cli/dsl.c), and an
  image whose CUDA runtime (CUDA_VERSION) is of a newer major than the driver's CUDA fails
  inside the trial even when its requirement lets it start (NGC images declare cuda>=9.0);
  driver R515 has no forward compatibility for CUDA 12 (deploy/cluster/images.py).
- A `--gpus all` container of the configured GPU image (Cluster.task_refs: what the agents
  pull) sees every GPU of the node at the pinned driver, and cuInit succeeds in it (802,
  CUDA_ERROR_SYSTEM_NOT_READY: the fabric manager is not running on an NVSwitch node).
- A container on Docker's bridge network (single-agent trials run there) with the master's
  task_container_defaults environment does an S3 round trip to the checkpoint bucket at the
  endpoint the master gives trials, with boto3 from the image. The keys go to the container on
  stdin: never on a command line, never in a file, never in a message.
- Started with task_container_defaults' devices, a container sees the node's /dev/infiniband;
  Docker refuses to create any container whose --device is missing on the node. (Its
  add_capabilities are not tried: IPC_LOCK is granted by Docker itself, from the daemon's
  bounding set.)

The containers run without the master: what the master adds to a real trial (its own
environment, the harness) is not tried here; a test experiment does that.

The three `docker run` checks share ONE container per agent (trial_probe), started as a trial
is: --gpus all, the bridge network, task_container_defaults' devices, environment and bind
mounts. A container start costs the node about a CPU-second, and verify runs these on every
agent. Only when that container does not run (or prints no result) does each check start its
own, so a failure still turns only its own cell red, with the same message as before.
"""

import json
import re
import shlex

import pytest
import yaml

MASTER_YAML = "/etc/determined/master.yaml"
DOCKER_TIMEOUT = 180  # seconds per container, pull included
TRUE = {"1", "t", "T", "TRUE", "true", "True"}  # NVIDIA_DISABLE_REQUIRE, as Go's ParseBool reads it

IN_GPU_CONTAINER = """
import ctypes, json, subprocess
q = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id,driver_version",
                    "--format=csv,noheader"], capture_output=True, text=True)
try:
    rc = ctypes.CDLL("libcuda.so.1").cuInit(0)
except OSError as e:
    rc = "libcuda.so.1 not loadable: %s" % e
print(json.dumps({"smi_rc": q.returncode, "smi": q.stdout, "smi_err": q.stderr[-300:], "cuInit": rc}))
"""

# Reads the keys from stdin; prints one line, never a key.
S3_ROUND_TRIP = """
import json, os, sys, uuid
s = json.load(sys.stdin)
try:
    import boto3
    from botocore.config import Config
except ImportError as e:
    print("FAIL import: %s" % e); sys.exit(0)
c = boto3.client("s3", endpoint_url=s["endpoint"], aws_access_key_id=s["access_key"],
                 aws_secret_access_key=s["secret_key"],
                 config=Config(connect_timeout=5, read_timeout=15, retries={"max_attempts": 1}))
key = s["key"] + uuid.uuid4().hex
body = uuid.uuid4().bytes
step = "put"
try:
    c.put_object(Bucket=s["bucket"], Key=key, Body=body)
    step = "get"
    got = c.get_object(Bucket=s["bucket"], Key=key)["Body"].read()
    step = "delete"
    c.delete_object(Bucket=s["bucket"], Key=key)
except Exception as e:
    print("FAIL %s: %s: %s" % (step, type(e).__name__, str(e)[:300])); sys.exit(0)
print("ok" if got == body else "FAIL get: other content", c.meta.region_name or "no-region")
"""


# --- what the master hands trials --------------------------------------------------------------


@pytest.fixture(scope="session")
def master_config(cluster, host_of) -> dict:
    """The deployed master.yaml (it holds the S3 keys: never printed)."""
    return yaml.safe_load(host_of(cluster.master_node).file(MASTER_YAML).content_string) or {}


def task_defaults(config: dict) -> dict:
    return config.get("task_container_defaults") or {}


def trial_image(config: dict) -> str | None:
    image = task_defaults(config).get("image")
    return image.get("cuda") if isinstance(image, dict) else image


def trial_environment(config: dict) -> list[str]:
    """environment_variables as a CUDA trial gets them (a list, or {cpu, cuda, rocm} lists)."""
    env = task_defaults(config).get("environment_variables") or []
    if isinstance(env, dict):
        env = env.get("cuda") or []
    return [str(e) for e in env]


def bind_flags(config: dict) -> list[str]:
    """task_container_defaults.bind_mounts as Docker flags (storage.tls: the CA trials trust)."""
    flags = []
    for m in task_defaults(config).get("bind_mounts") or []:
        readonly = ",readonly" if m.get("read_only") else ""
        flags.append(f"--mount=type=bind,source={m['host_path']},target={m['container_path']}{readonly}")
    return flags


def device_flags(config: dict) -> list[str]:
    flags = []
    for d in task_defaults(config).get("devices") or []:
        mode = f":{d['mode']}" if d.get("mode") else ""
        flags.append(f"--device={d['host_path']}:{d['container_path']}{mode}")
    return flags


# --- the driver and libnvidia-container's requirement check -------------------------------------


def driver_cuda(h) -> str:
    """The CUDA version the node's driver supports, from nvidia-smi's header."""
    m = re.search(r"CUDA Version:\s*([0-9.]+)", h.check_output("nvidia-smi"))
    assert m, "nvidia-smi shows no CUDA version"
    return m.group(1)


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split(".") if x.isdigit())


def _compare(have: str, op: str, want: str) -> bool:
    a, b = _version(have), _version(want)
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def requirement_met(predicate: str, facts: dict[str, str]) -> bool:
    """libnvidia-container's src/cli/dsl.c: space-separated alternatives, each a comma-separated
    conjunction; a condition on what is not known here (brand, arch) counts as met, as the cli
    does without a device."""
    for alternative in predicate.split():
        met = True
        for cond in filter(None, alternative.split(",")):
            m = re.fullmatch(r"([a-z]+)(>=|<=|!=|=|<|>)(.+)", cond.lower())
            if m and m.group(1) in facts:
                met = _compare(facts[m.group(1)], m.group(2), m.group(3))
            if not met:
                break
        if met:
            return True
    return not predicate.split()


def image_env(h, image: str) -> dict[str, str] | None:
    """The image's Env (pulled first if the node lacks it, as the agent would); None: unavailable."""
    fmt = "'{{json .Config.Env}}'"
    inspect = h.run(f"docker image inspect --format {fmt} {shlex.quote(image)}")
    if inspect.rc != 0:
        h.run(f"timeout {DOCKER_TIMEOUT} docker pull -q {shlex.quote(image)}")
        inspect = h.run(f"docker image inspect --format {fmt} {shlex.quote(image)}")
    if inspect.rc != 0:
        return None
    return dict(e.split("=", 1) for e in json.loads(inspect.stdout) if "=" in e)


def test_trial_image_cuda_within_driver(agent, host_of, cluster, master_config):
    h = host_of(agent)
    image = trial_image(master_config)
    assert image, f"{MASTER_YAML} names no task_container_defaults.image.cuda"
    env = image_env(h, image)
    assert env is not None, f"{image}: not on the node and `docker pull` failed"
    facts = {"cuda": driver_cuda(h), "driver": cluster.versions.nvidia_driver}
    cuda_version = env.get("CUDA_VERSION", "")
    required = env.get("NVIDIA_REQUIRE_CUDA", "")
    if cuda_version and not required:  # a legacy image (cuda_image.go IsLegacy)
        required = "cuda>=" + ".".join(cuda_version.split(".")[:2])
    if env.get("NVIDIA_DISABLE_REQUIRE") not in TRUE:
        first = required.split(" ")[0]
        assert requirement_met(required, facts), (
            f"{image}: nvidia-container-cli refuses it on driver {facts['driver']} (CUDA "
            f"{facts['cuda']}): unsatisfied condition: {first}"
        )
    if cuda_version:
        assert _version(cuda_version)[:1] <= _version(facts["cuda"])[:1], (
            f"{image}: ships CUDA {cuda_version} (CUDA_VERSION); driver {facts['driver']} runs CUDA "
            f"up to {facts['cuda']} with no forward compatibility to a newer major: CUDA fails "
            "to initialise in the trial"
        )


# --- a GPU container -------------------------------------------------------------------------


def host_gpus(h) -> set[str]:
    out = h.check_output("nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader")
    return {line.strip() for line in out.splitlines() if line.strip()}


def gpu_alone(h, image: str) -> dict:
    run = h.run(
        f"timeout {DOCKER_TIMEOUT} docker run --rm --gpus all {shlex.quote(image)} "
        f"python3 -c {shlex.quote(IN_GPU_CONTAINER)}"
    )
    assert run.rc == 0, f"docker run --gpus all {image}: {(run.stderr or run.stdout).strip()[-600:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_gpu_container_sees_gpus_and_cuda_initialises(agent, host_of, cluster, request, probes):
    h = host_of(agent)
    image = cluster.task_refs.gpu
    probe = trial_probe(h, agent, cluster, request, probes)
    seen = json.loads(probe["gpu"]) if probe else gpu_alone(h, image)
    assert seen["smi_rc"] == 0, f"nvidia-smi in the container exited {seen['smi_rc']}: {seen['smi_err']}"
    rows = [[p.strip() for p in line.split(",")] for line in seen["smi"].splitlines() if line.strip()]
    drivers = {r[2] for r in rows if len(r) == 3}
    assert drivers == {cluster.versions.nvidia_driver}, f"driver in the container: {sorted(drivers)}"
    missing = host_gpus(h) - {r[1] for r in rows if len(r) == 3}
    assert not missing, f"GPUs the node has and the container does not see: {sorted(missing)}"
    rc = seen["cuInit"]
    what = {802: " (CUDA_ERROR_SYSTEM_NOT_READY)", 803: " (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)"}
    assert rc == 0, (
        f"cuInit(0) in the container returned {rc}{what.get(rc, '') if isinstance(rc, int) else ''}"
    )


# --- the checkpoint store from a bridge container ----------------------------------------------


def run_with_stdin(h, command: str, data: bytes, timeout: int = DOCKER_TIMEOUT) -> tuple[int, str, str]:
    """`command` on the node with `data` on its stdin (testinfra's run has no stdin): what must
    not be in an argument list goes this way."""
    client = h.backend.client
    stdin, stdout, stderr = client.exec_command(h.backend.get_command(command), timeout=timeout)
    stdin.write(data)
    stdin.flush()
    stdin.channel.shutdown_write()
    out, err = stdout.read().decode(errors="replace"), stderr.read().decode(errors="replace")
    return stdout.channel.recv_exit_status(), out, err


def s3_request(agent, master_config: dict) -> dict:
    """What the round trip needs, keys included: it goes to the container on stdin only."""
    storage = master_config.get("checkpoint_storage") or {}
    prefix = str(storage.get("prefix") or "").strip("/")
    return {
        "endpoint": storage.get("endpoint_url"),
        "bucket": storage.get("bucket"),
        "access_key": storage.get("access_key"),
        "secret_key": storage.get("secret_key"),
        "key": f"{prefix + '/' if prefix else ''}verify/{agent.hostname}-",
    }


def trial_flags(master_config: dict) -> str:
    """task_container_defaults' environment and bind mounts as quoted Docker flags."""
    env = trial_environment(master_config)
    return " ".join([*(shlex.quote(f"--env={e}") for e in env), *map(shlex.quote, bind_flags(master_config))])


def s3_alone(h, image: str, request: dict, master_config: dict) -> str:
    command = (
        f"timeout {DOCKER_TIMEOUT} docker run --rm -i --network=bridge {trial_flags(master_config)} "
        f"{shlex.quote(image)} python3 -c {shlex.quote(S3_ROUND_TRIP)}"
    )
    rc, out, err = run_with_stdin(h, command, json.dumps(request).encode())
    assert rc == 0, f"docker run {image} on the bridge network exited {rc}: {err.strip()[-400:]}"
    return out.strip().splitlines()[-1] if out.strip() else "no output"


def test_s3_round_trip_from_bridge_container(agent, host_of, cluster, master_config, request, probes):
    h = host_of(agent)
    image = cluster.task_refs.gpu
    env = trial_environment(master_config)
    assert f"AWS_DEFAULT_REGION={cluster.storage.region}" in env, (
        f"task_container_defaults gives trials no AWS_DEFAULT_REGION={cluster.storage.region}"
    )
    # `request` stays pytest's: trial_probe reads master_config through it (a dict in its place
    # made every probe None, and each check started its own container).
    s3 = s3_request(agent, master_config)
    probe = trial_probe(h, agent, cluster, request, probes)
    result = probe["s3"] if probe else s3_alone(h, image, s3, master_config)
    assert result.startswith("ok"), (
        f"S3 round trip to {s3['endpoint']} bucket {s3['bucket']} from a bridge container: {result}"
    )


# --- InfiniBand in the container -----------------------------------------------------------------


def test_infiniband_in_trial_container(agent, host_of, cluster, master_config, request, probes):
    h = host_of(agent)
    on_node = h.run("ls -1 /dev/infiniband 2>/dev/null")
    node_devices = set(on_node.stdout.split()) if on_node.rc == 0 else set()
    flags = device_flags(master_config)
    if not any("/dev/infiniband" in f for f in flags):
        assert not node_devices, (
            "the node has /dev/infiniband; task_container_defaults.devices gives trials none"
        )
        return
    image = cluster.task_refs.gpu
    probe = trial_probe(h, agent, cluster, request, probes)
    if probe:
        seen = set(probe["ib"] or ())
    else:
        run = h.run(
            f"timeout {DOCKER_TIMEOUT} docker run --rm {' '.join(shlex.quote(f) for f in flags)} "
            f"{shlex.quote(image)} ls -1 /dev/infiniband"
        )
        why = (run.stderr or run.stdout).strip()[-400:]
        assert run.rc == 0, f"a container with task_container_defaults' devices does not start: {why}"
        seen = set(run.stdout.split())
    missing = node_devices - seen
    assert not missing, f"/dev/infiniband in the container lacks {sorted(missing)}"


# --- one container for the three checks above ------------------------------------------------

# Runs the GPU and S3 programs above in turn (their stdout captured, the S3 request on their
# stdin) and lists /dev/infiniband; everything arrives on stdin, nothing on the command line.
IN_TRIAL_CONTAINER = """
import contextlib, io, json, os, sys
job = json.load(sys.stdin)
def run(source, stdin_text):
    out = io.StringIO()
    sys.stdin = io.StringIO(stdin_text)
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(source, "<probe>", "exec"), {"__name__": "__main__"})
        except SystemExit:
            pass
        except Exception as e:
            print("FAIL %s: %s" % (type(e).__name__, str(e)[:300]))
    lines = out.getvalue().strip().splitlines()
    return lines[-1] if lines else "no output"
result = {"gpu": run(job["gpu"], ""), "s3": run(job["s3"], json.dumps(job["request"]))}
result["ib"] = sorted(os.listdir("/dev/infiniband")) if os.path.isdir("/dev/infiniband") else None
print("TRIAL-PROBE " + json.dumps(result))
"""


@pytest.fixture(scope="session")
def probes() -> dict[str, dict | None]:
    """trial_probe's results per agent, in this worker (a node's checks run on one)."""
    return {}


def trial_probe(h, agent, cluster, request, probes: dict) -> dict | None:
    """The three checks' results from one container started as a trial is; None when it did
    not run through (each check then starts its own container to say which part fails), or
    when the master's configuration cannot be read: the GPU check does not need the master,
    so a master that is down must not turn it red."""
    try:
        master_config = request.getfixturevalue("master_config")
    except Exception:
        return None
    if agent.hostname not in probes:
        image = cluster.task_refs.gpu
        devices = " ".join(shlex.quote(f) for f in device_flags(master_config))
        command = (
            f"timeout {DOCKER_TIMEOUT} docker run --rm -i --gpus all --network=bridge {devices} "
            f"{trial_flags(master_config)} {shlex.quote(image)} python3 -c {shlex.quote(IN_TRIAL_CONTAINER)}"
        )
        job = {"gpu": IN_GPU_CONTAINER, "s3": S3_ROUND_TRIP, "request": s3_request(agent, master_config)}
        rc, out, _ = run_with_stdin(h, command, json.dumps(job).encode())
        lines = [line for line in out.splitlines() if line.startswith("TRIAL-PROBE ")]
        probe = json.loads(lines[-1].split(" ", 1)[1]) if rc == 0 and lines else None
        if probe is not None:
            try:
                json.loads(probe["gpu"])  # the GPU program's own JSON line, or it failed early
            except ValueError:
                probe = None
        probes[agent.hostname] = probe
    return probes[agent.hostname]
