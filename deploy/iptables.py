"""What counts as a firewall rule on a node, as a pure function of iptables-save output.

Docker's own chains on agents (NAT for containers, DOCKER-* chains and the jumps to them)
are not a firewall between nodes: they are recreated by dockerd and left alone.
"""

BUILTIN_CHAINS = {"INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING"}
DOCKER_MARKERS = ("DOCKER", "docker0", "br-")


def _is_docker(line: str) -> bool:
    return any(marker in line for marker in DOCKER_MARKERS)


def foreign_rules(dump: list[str]) -> list[str]:
    """Lines of an iptables-save dump that are firewall state we must remove."""
    docker_present = any(_is_docker(line) for line in dump)
    found = []
    table = None
    for raw in dump:
        line = raw.strip()
        if not line or line.startswith("#") or line == "COMMIT":
            continue
        if line.startswith("*"):
            table = line[1:]
            continue
        if line.startswith(":"):
            chain, policy = line[1:].split()[:2]
            if chain in BUILTIN_CHAINS:
                # dockerd sets FORWARD to DROP when it enables forwarding for containers.
                docker_forward = docker_present and chain == "FORWARD" and table == "filter"
                if policy != "ACCEPT" and not docker_forward:
                    found.append(f"{table}: {line}")
            elif not _is_docker(chain):
                found.append(f"{table}: {line}")
            continue
        if not _is_docker(line):
            found.append(f"{table}: {line}")
    return found
