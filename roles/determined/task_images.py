"""The trial images on every agent before its Determined agent starts: the first trial does
not wait on a pull (Determined's agent pulls only an image it does not find: agent/pkg/docker
PullImage inspects first), and a registry that is down shows at deploy time, not in a trial.

configure: with `sources.registry_ca`, that CA as /etc/docker/certs.d/<registry>/ca.crt, the
           per-registry CA directory Docker reads on every connection (Docker's "Verify
           repository client with certificates": no daemon restart)
install:   `docker image pull` of determined.task_image.gpu and .cpu as the model's task_refs
           name them (images.site_ref: from `sources.registry` when set), unless present. A
           reference with a digest is present only as that exact image, so a second deploy
           pulls nothing; one without (the defaults) is pulled once, by tag.

Registry credentials are out of scope: a registry that needs a login needs `docker login`
on each agent (and task_container_defaults.registry_auth for Determined's own pulls).
"""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import docker, files

from deploy.cluster import Cluster, Node

CERTS_D = "/etc/docker/certs.d"


def pulled(cluster: Cluster) -> list[str]:
    """The references this role pulls (the model's task_refs), GPU image first, each once."""
    return list(cluster.task_refs.pulled)


@deploy("Trial images on the agent")
def apply(cluster: Cluster, node: Node) -> None:
    registry, ca = cluster.sources.registry, cluster.sources.registry_ca
    if registry is not None and ca is not None:
        # certs.d/<host:port>: the directory name is the registry as references name it.
        files.directory(
            name=f"Docker's CA directory for {registry}", path=f"{CERTS_D}/{registry}", mode="755"
        )
        files.put(
            name=f"Registry CA for {registry}",
            src=ca,
            dest=f"{CERTS_D}/{registry}/ca.crt",
            user="root",
            group="root",
            mode="644",
        )
    for ref in pulled(cluster):
        # pyinfra's own operation: pulls unless `docker image inspect` finds the image.
        docker.image(name=f"Trial image {ref}", image=ref, present=True)
