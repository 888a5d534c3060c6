# apt-update.sh TIMEOUT [ATTEMPTS] [DELAY] [OWN...]: `apt-get update` that fails when the index
# of a repository the deploy installs from could not be fetched, tried ATTEMPTS times (default
# 3), DELAY seconds apart (default 10); TIMEOUT is how long it waits for dpkg's lock
# (DPkg::Lock::Timeout). OWN are glob patterns of the files in sources.list.d the deploy relies
# on (its own and the distribution's); /etc/apt/sources.list always counts.
# Why: plain `apt-get update` exits 0 when an index could not be fetched ("W: Failed to fetch
# ...", "W: Some index files failed to download. They have been ignored, or old ones used
# instead."): the node then installs from stale lists or none, and fails later with a wrong
# cause. APT::Update::Error-Mode=any (apt's `--error-on=any`, also in Ubuntu 20.04's updated
# apt; an apt without it ignores the key) makes it an error. A caching proxy can fail a
# request for a moment: at 64 nodes the lab's apt-cacher-ng, with ~40 nodes refreshing their
# lists at once, answered two nodes' requests for NVIDIA's index with 503, and their updates
# went on without NVIDIA's repository. So a failed update is tried again before the host fails.
# A site's other repositories (a monitoring agent's, a stale PPA) are not the deploy's to
# judge: when the whole update fails, the same update over only the OWN sources
# (Dir::Etc::sourceparts pointed at a folder of links to them; APT::Get::List-Cleanup=0 keeps
# the other lists) decides, and the others' failure is a warning.
timeout=$1
attempts=${2:-3}
delay=${3:-10}
if [ "$#" -ge 3 ]; then shift 3; else set --; fi
parts=$(apt-config shell P Dir::Etc::sourceparts/d | sed -n "s/^P='\(.*\)'$/\1/p")
own=$(mktemp -d)
trap 'rm -rf "$own"' EXIT
for pattern in "$@"; do
    for f in "$parts"/$pattern; do
        [ -e "$f" ] && ln -sf "$f" "$own/"
    done
done
attempt=1
while :; do
    if apt-get -o DPkg::Lock::Timeout="$timeout" -o APT::Update::Error-Mode=any update; then
        exit 0
    fi
    if [ "$#" -gt 0 ] && apt-get -o DPkg::Lock::Timeout="$timeout" -o APT::Update::Error-Mode=any \
        -o Dir::Etc::sourceparts="$own" -o APT::Get::List-Cleanup=0 update >/dev/null; then
        echo "apt-get update: a repository the deploy does not install from failed (apt's" \
            "messages above): its lists stay stale; the deploy's repositories are up to date" >&2
        exit 0
    fi
    if [ "$attempt" -ge "$attempts" ]; then
        echo "apt-get update failed $attempts times (apt's messages above)" >&2
        exit 1
    fi
    echo "apt-get update failed (attempt $attempt of $attempts): again in ${delay}s" >&2
    sleep "$delay"
    attempt=$((attempt + 1))
done
