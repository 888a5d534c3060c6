# Lab stand-in for the MinIO server binary: package marker for its mirror builder (build.py).
