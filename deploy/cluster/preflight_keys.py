"""cluster.yaml's `preflight` section: what a node must be before anything is installed."""

from dataclasses import dataclass
from typing import Annotated

from deploy.cluster import checks
from deploy.cluster.keys import Key

SECURE_BOOT = ("refuse", "signed_modules")


@dataclass(frozen=True)
class Preflight:
    # ("Ubuntu 20.04", ("5.4.0-*-generic",)) pairs: a tuple keeps the model immutable.
    # The kernel series of each release's GA kernel, the one MLNX_OFED 5.8 and driver 515
    # support there (docs/operations.md "Kernels"); the build is the operator's update.
    allowed_os: Annotated[
        tuple[tuple[str, tuple[str, ...]], ...],
        Key(
            checks.allowed_os,
            (("Ubuntu 20.04", ("5.4.0-*-generic",)), ("Ubuntu 22.04", ("5.15.0-*-generic",))),
            "the OS releases and kernel series preflight accepts on a node",
        ),
    ]
    certified_kernels: Annotated[
        tuple[str, ...],
        Key(
            checks.kernel_patterns,
            ("5.4.0-100-generic", "5.15.0-100-generic"),
            "the kernel builds the cluster was certified on: another allowed build only warns; "
            "`[]` turns the warning off",
        ),
    ]
    secure_boot: Annotated[
        str,
        Key(
            checks.choice(SECURE_BOOT),
            "refuse",
            "`refuse` a node booted with Secure Boot on, or `signed_modules`: you enrolled a "
            "Machine Owner Key that signs the DKMS modules (docs/operations.md)",
        ),
    ]
    min_free_disk_gb: Annotated[
        float, Key(checks.number_at_least(0), 50.0, "free space preflight demands on `disk_path`, in GB")
    ]
    disk_path: Annotated[str, Key(checks.abs_path, "/", "where preflight measures free space")]
