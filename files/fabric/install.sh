# install.sh TARBALL WORK_DIR TOP RELEASE OPENIBD LOCK_TIMEOUT, run by roles/fabric/mofed.py (see
# roles/shared/scripts.py). Unpacks the (sha256-verified) MLNX_OFED TARBALL into WORK_DIR, where it
# makes the directory TOP; waits up to LOCK_TIMEOUT seconds until no apt or dpkg runs; runs
# mlnxofedinstall, explains its exit status, restarts OPENIBD and checks that `ofed_info -s`
# names RELEASE. Success removes the unpacked tree and the tarball; a failure keeps the
# tarball for the next attempt. Every message starts with RELEASE.
tarball=$1 work=$2 top=$3 release=$4 openibd=$5 lock_timeout=$6
tree="$work/$top"
say() { echo "$release: $*" >&2; }

# The apt and dpkg processes running now (their names as /proc shows them: 15 characters).
apt_busy() {
    for c in /proc/[0-9]*/comm; do
        { read -r n <"$c"; } 2>/dev/null || continue
        case $n in dpkg | apt | apt-get | aptitude | unattended-upgr | apt.systemd.dai) echo "$n" ;; esac
    done | sort -u | tr '\n' ' '
}

rm -rf "$tree" && mkdir -p "$work" || exit 1
tar -xzf "$tarball" -C "$work" || { say "cannot unpack $tarball"; exit 1; }
[ -x "$tree/mlnxofedinstall" ] || { say "$tarball holds no $top/mlnxofedinstall"; exit 1; }
# A node's own apt jobs (apt-daily.service, unattended-upgrades: their timers fire at boot
# when a run was missed) hold dpkg's lock for minutes. mlnxofedinstall runs dpkg without
# waiting for it, and its install then fails ("Failed to install MLNX_OFED_LINUX packages",
# exit 1). Wait as apt-get's DPkg::Lock::Timeout does.
waited=0
while busy=$(apt_busy) && [ -n "$busy" ]; do
    if [ "$waited" -ge "$lock_timeout" ]; then
        say "apt or dpkg still runs after ${lock_timeout}s (${busy% }): let it finish, then deploy again"
        exit 1
    fi
    sleep 5
    waited=$((waited + 5))
done
(cd "$tree" && ./mlnxofedinstall --without-fw-update --add-kernel-support --force)
rc=$?
# mlnxofedinstall's exit statuses (MLNX_OFED user manual). After 0 and 2 the software is in
# place; anything else stops the host.
case $rc in
    0) ;;
    2) say "mlnxofedinstall exited 2: no firmware was found for the adapter (the software itself is installed)" ;;
    1) say "mlnxofedinstall exited 1: the installation failed"; exit 1 ;;
    22) say "mlnxofedinstall exited 22: invalid parameter"; exit 1 ;;
    28) say "mlnxofedinstall exited 28: not enough free disk space"; exit 1 ;;
    171) say "mlnxofedinstall exited 171: not applicable to this system (no supported adapter or OS?)"; exit 1 ;;
    172) say "mlnxofedinstall exited 172: prerequisites are not met (missing packages or kernel headers?)"; exit 1 ;;
    173) say "mlnxofedinstall exited 173: the mst driver failed to start"; exit 1 ;;
    *) say "mlnxofedinstall exited $rc: unexpected exit status"; exit 1 ;;
esac
"$openibd" restart || { say "$openibd restart failed"; exit 1; }
now=$(ofed_info -s 2>/dev/null)
[ "$now" = "$release:" ] || { say "after the installation ofed_info -s says '$now'"; exit 1; }
rm -rf "$tree" "$tarball"
