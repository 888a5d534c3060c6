"""MinIO, the object store: the server (minio), its TLS and every node's trust of its CA (tls), the
deploy's own MinIO users (iam; the admin-API side is deploy/minio_admin.py, which verify reads
too). Files: files/minio/.
"""
