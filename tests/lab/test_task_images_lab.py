"""Task images on the lab: the controller's registry (Debian's docker-registry, TLS from the
lab CA) serves the three stand-in images; after a deploy every agent has both configured
images under the site reference master.yaml names, the GPU image imports boto3 from a bridge
container, containers get determined.memlock_bytes as their locked-memory limit (unlimited by
default; the lab's cluster.yaml says why not there), and a second deploy changes nothing.
"""

import json
import shlex
import ssl
import urllib.error
import urllib.request

import pytest

from . import registry


def _manifest(name: str, tag: str, context: ssl.SSLContext) -> tuple[str, dict]:
    req = urllib.request.Request(
        f"https://{registry.HOST}/v2/{name}/manifests/{tag}", headers={"Accept": registry.MANIFEST_TYPE}
    )
    with urllib.request.urlopen(req, context=context, timeout=30) as resp:
        return resp.headers["Docker-Content-Digest"], json.loads(resp.read())


def test_registry_serves_the_three_images_over_tls(lab):
    trusted = ssl.create_default_context(cafile=str(registry.CA_CRT))
    served = {}
    for image in registry.IMAGES:
        digest, doc = _manifest(image.name, image.tag, trusted)
        assert doc["mediaType"] == registry.MANIFEST_TYPE and len(doc["layers"]) == len(
            registry.LAYER_HISTORY
        )
        served[image.ref] = f"{image.ref}@{digest}"
    # cluster.yaml pins the two configured ones to what the registry serves (lab up keeps it so).
    assert {lab.determined.task_image.gpu, lab.determined.task_image.cpu} <= set(served.values())
    # Without the lab's CA the registry is not trusted: TLS is real.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        _manifest(registry.IMAGES[0].name, registry.IMAGES[0].tag, ssl.create_default_context())


def test_agents_have_both_images_and_dockers_settings(deployed, lab, lab_ssh):
    refs = [lab.task_refs.gpu, lab.task_refs.cpu]
    assert all(r.startswith(f"{registry.HOST}/determinedai/environments:") for r in refs)
    ca = registry.CA_CRT.read_text()
    for agent in lab.agents:
        h = agent.hostname
        for ref in refs:
            out = lab_ssh(
                h, f"docker image inspect --format '{{{{json .Config.Env}}}}' {shlex.quote(ref)}"
            ).stdout
            assert any(e.startswith("PYTHONHASHSEED=") for e in json.loads(out)), (h, ref)
        assert lab_ssh(h, f"cat /etc/docker/certs.d/{registry.HOST}/ca.crt").stdout == ca
        daemon = json.loads(lab_ssh(h, "cat /etc/docker/daemon.json").stdout)
        assert "nvidia" in daemon["runtimes"], h
        limit = lab.determined.memlock_bytes
        assert daemon["default-ulimits"]["memlock"] == {"Name": "memlock", "Hard": limit, "Soft": limit}, h


def test_gpu_image_imports_boto3_on_the_bridge_with_the_memlock_limit(deployed, lab, lab_ssh):
    ref = shlex.quote(lab.task_refs.gpu)
    h = lab.agents[0].hostname
    boto = lab_ssh(
        h, f"docker run --rm --network bridge {ref} python3 -c 'import boto3; print(boto3.__version__)'"
    )
    assert boto.stdout.strip() == "1.34.162"
    # `ulimit -l` counts KiB. Unlimited where the node may raise it (a real server's root);
    # the lab's cluster.yaml says why its nodes cannot (determined.memlock_bytes).
    limit = lab.determined.memlock_bytes
    memlock = lab_ssh(h, f"docker run --rm {ref} sh -c 'ulimit -l'")
    assert memlock.stdout.strip() == ("unlimited" if limit == -1 else str(limit // 1024))


def test_second_deploy_pulls_and_changes_nothing(deployed, deploy):
    again = deploy()
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.results["totals"]["success"] == 0, again.changed_operations()
