#!/bin/sh
# Stands in for MLNX_OFED's /etc/init.d/openibd (package mlnx-ofed-kernel-utils @KERNEL_VERSION@); lab only.
### BEGIN INIT INFO
# Provides:       openibd
# Required-Start: $local_fs
# Required-Stop:  $local_fs
# Default-Start:  2 3 4 5
# Default-Stop:   0 1 6
# Short-Description: Activates/Deactivates InfiniBand Driver to start at boot time.
### END INIT INFO
# "Loading the HCA driver" records a flag in /run and loads "ib_ipoib": the real openibd
# loads the stack's modules (openib.conf IPOIB_LOAD=yes by default) and ib_ipoib creates the
# IPoIB interface, ib0, which does not exist before (no rdma-core on a bare node). The lab's
# fabric port is a veth that waits parked as @IB_PARKED@ (tests/lab/network.py) until this
# start names it @IB_KERNEL_NAME@. Left out: a real stop removes ib0 with the module; the
# stand-in's stop keeps the link, so a restart does not drop the node off the fabric.
STATE_DIR=/run/mlnx-ofed-standin

ok() { printf '%-58s[  OK  ]\n' "$1"; }

# The device nodes the loaded modules create (ib_umad: umad0 231:0 and issm0 231:64,
# ib_uverbs: uverbs0 231:192, rdma_ucm: the misc device rdma_cm), which a trial container gets
# through Docker's --device /dev/infiniband (Determined's InfiniBand checklist).
IB_DEV=/dev/infiniband

start() {
    mkdir -p "$STATE_DIR" "$IB_DEV"
    for node in umad0:231:0 issm0:231:64 uverbs0:231:192 rdma_cm:10:58; do
        IFS=: read -r name major minor <<EOF_NODE
$node
EOF_NODE
        [ -e "$IB_DEV/$name" ] || mknod -m 666 "$IB_DEV/$name" c "$major" "$minor"
    done
    if ip link show dev @IB_PARKED@ >/dev/null 2>&1; then
        ip link set dev @IB_PARKED@ name @IB_KERNEL_NAME@
    fi
    echo "@OFED_VERSION@" > "$STATE_DIR/driver-loaded"
    ok "Loading HCA driver and Access Layer:"
}

stop() {
    rm -f "$STATE_DIR/driver-loaded"
    rm -rf "$IB_DEV"
    ok "Unloading HCA driver:"
}

case "$1" in
  start) start ;;
  stop) stop ;;
  restart|force-reload) stop; start ;;
  status)
    if [ -e "$STATE_DIR/driver-loaded" ]; then
      echo
      echo "  HCA driver loaded"
      echo
      echo "Configured IPoIB devices:"
      echo "ib0"
      echo
      echo "Currently active IPoIB devices:"
      if [ "$(cat /sys/class/net/ib0/operstate 2>/dev/null)" = up ]; then echo "ib0"; fi
      echo "Configured Mellanox EN devices:"
      echo
      echo "Currently active Mellanox devices:"
      echo "ib0"
      echo
      echo "The following OFED modules are loaded:"
      echo
      echo "  rdma_ucm"
      echo "  rdma_cm"
      echo "  ib_ipoib"
      echo "  mlx5_core"
      echo "  mlx5_ib"
      echo "  ib_uverbs"
      echo "  ib_umad"
      echo "  ib_cm"
      echo "  ib_core"
      echo "  mlxfw"
      echo
      exit 0
    fi
    echo
    echo "  HCA driver is not loaded"
    echo
    exit 3
    ;;
  *)
    echo "Usage: $0 {start|force-start|stop|force-stop|restart|force-restart|status}"
    exit 1
    ;;
esac
exit 0
