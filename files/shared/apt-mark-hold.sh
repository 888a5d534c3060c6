# apt-mark-hold.sh TIMEOUT PACKAGE...: `apt-mark hold PACKAGE...`, waiting up to TIMEOUT seconds
# for dpkg's lock the way apt-get does with DPkg::Lock::Timeout.
# Why: apt-mark hands the holds to `dpkg --set-selections`, which takes dpkg's frontend lock
# itself and gives up at once when another process has it ("dpkg: error: dpkg frontend lock
# was locked by another process with pid N", then apt-mark's "E: Executing dpkg failed. Are you
# root?"). On a freshly booted Debian or Ubuntu node that process is often apt-daily.service
# or unattended-upgrades: their timers fire at boot when a run was missed. Any other failure
# is reported at once, unchanged.
timeout=$1
shift
waited=0
while :; do
    # C locale: the lock message is matched below, and apt and dpkg translate their messages.
    if out=$(LC_ALL=C apt-mark hold "$@" 2>&1); then
        printf '%s\n' "$out"
        exit 0
    fi
    case $out in
        *"lock"*) ;;
        *) printf '%s\n' "$out" >&2; exit 1 ;;
    esac
    [ "$waited" -eq 0 ] && echo "apt-mark hold: dpkg's lock is held by another process: waiting up to ${timeout}s" >&2
    if [ "$waited" -ge "$timeout" ]; then
        printf '%s\n' "$out" >&2
        echo "apt-mark hold: dpkg's lock was still held by another process after ${timeout}s" >&2
        exit 1
    fi
    sleep 5
    waited=$((waited + 5))
done
