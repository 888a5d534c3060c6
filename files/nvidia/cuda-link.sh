#!/bin/sh
# cuda-link.sh HOME PRIORITY LINK, from roles/nvidia/cuda.py: LINK (/usr/local/cuda) -> HOME through
# the "cuda" alternative, the name and priority NVIDIA's own packages use.
set -u
home=$1 priority=$2 link=$3
if [ ! -d "$home" ]; then
    echo "$home is missing: the toolkit is not installed" >&2
    exit 1
fi
update-alternatives --install "$link" cuda "$home" "$priority" &&
    update-alternatives --set cuda "$home" || exit 1
if [ "$(readlink -e "$link")" != "$home" ]; then
    echo "$link does not lead to $home after update-alternatives (is $link a directory rather than a link?)" >&2
    exit 1
fi
