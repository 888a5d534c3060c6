"""cluster.yaml's `versions` section: the pinned vendor releases."""

from dataclasses import dataclass
from typing import Annotated

from deploy.cluster.keys import pinned


@dataclass(frozen=True)
class Versions:
    nvidia_driver: Annotated[str, pinned("515.65.01", "the NVIDIA driver")]
    cuda: Annotated[str, pinned("11.7.1", "the CUDA toolkit")]
    nccl: Annotated[str, pinned("2.14.3", "NCCL")]
    mofed: Annotated[str, pinned("5.8-3.0.7.0", "MLNX_OFED", r"\d+\.\d+-[\d.]+", "`N.N-N.N…`")]
