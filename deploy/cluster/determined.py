"""cluster.yaml's `determined` section: the master, the agents and the task images."""

from dataclasses import dataclass
from typing import Annotated

from deploy.cluster import checks, images, master_tls
from deploy.cluster.keys import Key, SecretKey, Section, pinned
from deploy.secrets import Secret

AGENT_LAYOUTS = ("per_node", "per_domain")
SLOT_TYPES = ("auto", "cuda", "gpu", "rocm", "cpu", "none")


@dataclass(frozen=True)
class TaskImage:
    # Determined 0.38's own default (determinedai/pytorch-ngc:0.38.0) is CUDA 12.4: driver 515
    # cannot run it. The defaults are Determined's CUDA 11.3 images, by tag (deploy/cluster/images.py).
    gpu: Annotated[
        str,
        Key(
            images.image_ref,
            images.DEFAULT_GPU_IMAGE,
            "the image of GPU trials (task_container_defaults.image.cuda); the default has no "
            "public digest: pin it, see below",
        ),
    ]
    cpu: Annotated[
        str,
        Key(
            images.image_ref,
            images.DEFAULT_CPU_IMAGE,
            "the image of CPU-only tasks (task_container_defaults.image.cpu); pin it likewise",
        ),
    ]


# The non-admin Determined user verify's smoke experiments run as: roles/determined/users.py
# makes it, its password kept on the master node in SMOKE_LOGIN (0600 root), read by verify.
SMOKE_USER = "cluster-smoke"
SMOKE_LOGIN = "/etc/determined/smoke-user.json"


@dataclass(frozen=True)
class Determined:
    version: Annotated[str, pinned("0.38.0", "the Determined release")]
    admin_password: Annotated[
        Secret,
        SecretKey(
            "the password of Determined's admin user",
            "the password of Determined's admin user: the master's initial one, and set through its "
            "API by a later deploy when it changed (run that deploy with DET_USER/DET_PASS naming a "
            "login that works); Determined's policy: 8+ characters with an upper-case letter, a "
            "lower-case letter and a digit",
        ),
    ]
    agent_layout: Annotated[
        str,
        Key(
            checks.choice(AGENT_LAYOUTS),
            "per_node",
            "one agent per node, or `per_domain`: one agent per NVLink domain",
        ),
    ]
    resource_pool: Annotated[
        str,
        Key(
            checks.matching(r"[A-Za-z0-9][A-Za-z0-9_.-]*", "a resource pool name", rule="resource pool name"),
            "default",
            "the agents' resource pool",
        ),
    ]
    slot_type: Annotated[str, Key(checks.choice(SLOT_TYPES), "cuda", "what a slot of an agent is")]
    task_image: Annotated[TaskImage, Section()]
    # Determined's own default (DefaultTaskContainerDefaults); Docker's is 64 MiB.
    shm_size_bytes: Annotated[
        int,
        Key(
            checks.integer(67108864),
            4294967296,
            "/dev/shm of each trial container (task_container_defaults.shm_size_bytes)",
        ),
    ]
    # Docker's daemon.json default-ulimits (roles/determined/docker.py): RDMA locks its buffers.
    memlock_bytes: Annotated[
        int, Key(images.memlock, -1, "`ulimit -l` of every container on the agents, bytes; -1: unlimited")
    ]
    tls: Annotated[master_tls.DeterminedTls, master_tls.SECTION]
