"""The toolkit's own pyinfra facts: what the roles need that pyinfra 3.10 does not ship.

system.py      disk space, a network interface, link types, netplan's features, firewall dumps,
               a resolved path, a unit's state
apt.py         held packages, the versions apt's sources offer
keyring.py     the installed CUDA keyring against the kept, verified .deb
trust.py       the keys of an OpenPGP keyring file; a secret file's owner and mode (no hash)
gpu.py         `nvidia-smi topo -m` and the GPUs' MIG modes (parsing: deploy/topology.py)
fabric.py      the installed MLNX_OFED release, `ibstat` parsing
determined.py  the per-domain Determined agents a node has
postgresql.py  what the PostgreSQL role reads from the server

Every command exits 0 even when what it asks about is absent: pyinfra fails a host whose
fact command fails. Where one of pyinfra's facts does the job (File, FileContents, FindFiles,
DebPackages, SystemdEnabled, ...), the roles use it instead.
"""
