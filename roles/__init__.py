"""The roles: one package per service, and one shared layer.

    apt/         the node's package sources: the proxy, the pinned repositories and their holds
    node/        every node's base: preflight, /etc/hosts, no firewall
    minio/       the object store: the server, its TLS (and every node's trust of it), its users
    postgresql/  the database: the server, Determined's database role, the nightly backup
    nvidia/      the GPU stack on agents: driver, GPU services, CUDA toolkit, NCCL
    fabric/      the InfiniBand fabric: MLNX_OFED, the IPoIB interface
    determined/  Determined: master, agents (and their domains), users, TLS, Docker, task images
    shared/      what every package uses and none owns: operations (ops), kept scripts and
                 templates over files/, apt's list refresh, the running kernel's headers and hold

A package's static files and templates are files/<package>/ (files_path("minio/...")). A
package imports another's public names only; deploy/site.py calls each role's apply().
"""
