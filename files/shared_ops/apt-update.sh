# apt-update.sh TIMEOUT [ATTEMPTS] [DELAY]: `apt-get update` that fails when a repository's
# index could not be fetched, tried ATTEMPTS times (default 3), DELAY seconds apart (default 10);
# TIMEOUT is how long it waits for dpkg's lock (DPkg::Lock::Timeout).
# Why: plain `apt-get update` exits 0 when an index could not be fetched ("W: Failed to fetch
# ...", "W: Some index files failed to download. They have been ignored, or old ones used
# instead."): the node then installs from stale lists or none, and fails later with a wrong
# cause. APT::Update::Error-Mode=any (apt's `--error-on=any`, also in Ubuntu 20.04's updated
# apt; an apt without it ignores the key) makes it an error. A caching proxy can fail a
# request for a moment: at 64 nodes the lab's apt-cacher-ng, with ~40 nodes refreshing their
# lists at once, answered two nodes' requests for NVIDIA's index with 503, and their updates
# went on without NVIDIA's repository. So a failed update is tried again before the host fails.
timeout=$1
attempts=${2:-3}
delay=${3:-10}
attempt=1
while :; do
    if apt-get -o DPkg::Lock::Timeout="$timeout" -o APT::Update::Error-Mode=any update; then
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
