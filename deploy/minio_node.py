"""Where the deploy puts MinIO's certificates and the storage CA on the nodes (storage.tls):
named once here for roles/minio/tls.py, which writes them, roles/determined/master.py, which
hands the bundle to trials, and tests/verify, which checks them. No role module: verify
imports none (tests/unit/test_shape.py).
"""

# The deploy's own directory for MinIO: only certs/ is in it, and only with storage.tls
# (`--certs-dir`; minio-user has no home for MinIO's default ${HOME}/.minio/certs).
CONFIG_DIR = "/etc/minio"
CERTS_DIR = f"{CONFIG_DIR}/certs"
USER = "minio-user"  # the unit runs MinIO as this user: it owns public.crt and private.key
# update-ca-certificates(8) reads only *.crt files under /usr/local/share/ca-certificates.
SYSTEM_CA = "/usr/local/share/ca-certificates/gpu-cluster-storage-ca.crt"
# ca-certificates' bundle, every trusted CA in one file (update-ca-certificates writes it).
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# Where trial containers find the node's bundle: a path of its own, so the image's own
# /etc/ssl/certs (Ubuntu's, NGC's) stays as it is for everything that reads it.
CONTAINER_BUNDLE = "/etc/gpu-cluster/ca-certificates.crt"
