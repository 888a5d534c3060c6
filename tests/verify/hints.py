"""What a red cell of the verify matrix means, and the first thing to do about it.

One entry per check in tests/verify/test_*.py (tests/unit/test_verify_matrix.py fails when a
check has none). The symptoms and first actions come from the source article's troubleshooting
table and pitfalls, corrected where the vendors' sources say the article is wrong (Determined
rejects a `region:` key in checkpoint_storage; an agent's master_port defaults to 80, not the
master's port; ...).
`{node}` in a text is replaced by the cell's node.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Hint:
    symptom: str
    action: str

    def format(self, node: str) -> "Hint":
        return Hint(self.symptom.replace("{node}", node), self.action.replace("{node}", node))


REDEPLOY = "re-run the deploy (`pyinfra -y INVENTORY deploy.py`)"

HINTS: dict[str, Hint] = {
    # --- test_node_base.py ------------------------------------------------------------------
    "test_os_and_kernel_allowed": Hint(
        "OS release or kernel not in preflight.allowed_os",
        "compare `uname -r` and /etc/os-release with preflight.allowed_os; old kernels (4.15) "
        "make RDMA / GPUDirect unstable: upgrade the kernel, not the allow-list",
    ),
    "test_hostname": Hint(
        "the node's hostname differs from nodes[].hostname in cluster.yaml",
        "`hostnamectl set-hostname NAME` on {node} (or fix cluster.yaml), then " + REDEPLOY,
    ),
    "test_etc_hosts_maps_every_node": Hint(
        "'Failed to resolve hostname': the /etc/hosts block is missing or stale",
        "`getent hosts PEER` on {node}; " + REDEPLOY + " (the hosts role writes the block)",
    ),
    "test_ipoib_interface_static_and_up": Hint(
        "the node's IPoIB interface (named in the detail) missing, down, or with the wrong "
        "address / MTU / mode",
        "`ip -d addr show` and `ibstat` on {node} (is openibd up?); a port named otherwise "
        "(ibp65s0, ...): set the node's ipoib_interface in cluster.yaml; then " + REDEPLOY,
    ),
    "test_no_firewall_rules": Hint(
        "firewall rules present: heartbeats / NCCL traffic dropped, agents stay 'pending'",
        "ufw disable and flush chains (`iptables -F; iptables -X`, also ip6tables, nat, mangle), "
        "then " + REDEPLOY,
    ),
    "test_ufw_disabled": Hint(
        "ufw is enabled (ENABLED=yes in /etc/ufw/ufw.conf)",
        "ufw disable and flush chains on {node}, then " + REDEPLOY,
    ),
    # --- test_cross_node.py (row = the node the majority blames; the peers are in the detail) -
    "test_reaches_peer_on_management": Hint(
        "cannot reach a peer's port 22 on the management network",
        "`getent hosts PEER` and `ip route` on {node}; firewall on either side "
        "(`iptables-save`); all nodes in one layer-2 segment, no NAT",
    ),
    "test_reaches_peer_on_ipoib": Hint(
        "no path to a peer over IPoIB: NCCL will fail with 'AllReduce timeout after 300 seconds'",
        "`ibstat` / `iblinkinfo` on both nodes (port Down: cabling, subnet manager); "
        "`ip addr show` of the IPoIB interface; the HOST-<interface> names in /etc/hosts",
    ),
    # --- test_gpu_stack.py ------------------------------------------------------------------
    "test_driver_version_on_every_gpu": Hint(
        "NVIDIA driver version mismatch, or nvidia-smi fails / sees no GPU",
        REDEPLOY + " (pinned cuda-drivers), then reboot {node} if it asks; `nvidia-smi`",
    ),
    "test_persistence_mode_on_every_gpu": Hint(
        "persistence mode off: the first CUDA call of every trial waits for the driver to "
        "initialise the GPUs (seconds each), and the GPUs' state is lost between jobs",
        "`systemctl status nvidia-persistenced` on {node} (its drop-in removes "
        "--no-persistence-mode); " + REDEPLOY,
    ),
    "test_fabric_manager_matches_nvswitches": Hint(
        "NVSwitch node without a running fabric manager: CUDA fails with error 802 "
        "(system not ready) while nvidia-smi looks healthy; or a fabric manager on a node "
        "without NVSwitches",
        "`systemctl status nvidia-fabricmanager` and `journalctl -u nvidia-fabricmanager` on "
        "{node} (a driver version mismatch names both versions); " + REDEPLOY,
    ),
    "test_nvidia_peermem_loads_at_boot": Hint(
        "nvidia-peermem is not loaded at boot: NCCL falls back from GPUDirect RDMA to copies "
        "through host memory",
        REDEPLOY + "; `modinfo nvidia-peermem` on {node} (missing: the driver was built before "
        "MLNX_OFED, reinstall the driver packages)",
    ),
    "test_nvidia_peermem_loaded": Hint(
        "nvidia-peermem is not loaded now: NCCL falls back from GPUDirect RDMA to copies "
        "through host memory until it is",
        REDEPLOY + " (it runs `modprobe nvidia-peermem`); on {node}, modprobe's \"could not "
        "insert 'nvidia_peermem': Invalid argument\" means the driver was built before "
        "MLNX_OFED (reinstall nvidia-dkms-<branch>), a version other than the driver's means "
        "its reboot is owed",
    ),
    "test_no_driver_reboot_pending": Hint(
        "a new driver is installed but the old kernel module is still loaded",
        "reboot {node} (`cat /run/reboot-required.pkgs`), then verify again",
    ),
    "test_nouveau_blacklisted": Hint(
        "nouveau is not blacklisted: it can grab the GPUs before the NVIDIA driver",
        REDEPLOY + " (blacklist + update-initramfs -u), then reboot {node}",
    ),
    "test_cuda_link_resolves_to_pinned_toolkit": Hint(
        "/usr/local/cuda points to another CUDA toolkit than the pinned one",
        "`readlink -e /usr/local/cuda` on {node}; " + REDEPLOY,
    ),
    "test_nvcc_release": Hint(
        "nvcc version mismatch (CUDA 12.x risks ncclCommInitAll failures)",
        REDEPLOY + " (cuda-toolkit-X-Y only: never cuda-X-Y, it pulls another driver)",
    ),
    "test_login_shell_finds_cuda": Hint(
        "a login shell does not find nvcc or the CUDA libraries",
        "`bash -lc 'command -v nvcc; echo $LD_LIBRARY_PATH'` on {node}; " + REDEPLOY,
    ),
    "test_nccl_library_and_version": Hint(
        "NCCL version mismatch, or the library is missing",
        REDEPLOY + " (libnccl2 from NVIDIA's repo, not the distribution's); "
        "`ldconfig -p | grep nccl` on {node}",
    ),
    "test_pinned_packages_installed_and_held": Hint(
        "a pinned GPU package is missing, at another version, or not held",
        "`apt-mark showhold` on {node} (did an unattended upgrade move it?), then " + REDEPLOY,
    ),
    "test_apt_candidate_is_the_pin": Hint(
        "apt would install another version than the pin on the next upgrade",
        "`apt-cache policy PACKAGE` on {node}; " + REDEPLOY + " (/etc/apt/preferences.d/)",
    ),
    "test_ofed_release": Hint(
        "MLNX_OFED missing or another version (with community OFED ibstat cannot see the HCA)",
        "`ofed_info -s` on {node}; " + REDEPLOY,
    ),
    "test_running_kernel_held": Hint(
        "the running kernel's packages are not held (or unattended-upgrades may upgrade them): "
        "a new kernel boots without MLNX_OFED's modules, which were built for this one",
        "`apt-mark showhold` and `apt-config dump Unattended-Upgrade::Package-Blacklist` on "
        "{node}, then " + REDEPLOY + "; to move to a new kernel see docs/operations.md",
    ),
    "test_ib_ports_active": Hint(
        "ib0 port Down (State Initializing = no subnet manager): 'AllReduce timeout'",
        "check cabling and the subnet manager (ibstat, iblinkinfo); reseat fibre / SFP",
    ),
    "test_subnet_manager_master": Hint(
        "no subnet manager answers `sminfo` (ports stay Initializing, NCCL/IB traffic cannot "
        "start), or opensmd is not running on network.subnet_manager's node",
        "`sminfo` and `ibstat` (SM lid) on {node}; on network.subnet_manager's node "
        "`systemctl status opensmd` and /var/log/opensm.log; no SM on the switch or UFM: name a "
        "node in network.subnet_manager, then " + REDEPLOY,
    ),
    # --- test_storage.py --------------------------------------------------------------------
    "test_minio_service": Hint(
        "MinIO is not running, or its binary / service user is wrong",
        "`journalctl -u minio` on {node}; " + REDEPLOY,
    ),
    "test_minio_ready_from_controller": Hint(
        "MinIO does not answer /minio/health/ready from the controller",
        "`journalctl -u minio` on {node}; port 9000 blocked (firewall) or bound elsewhere",
    ),
    "test_minio_ready_on_node": Hint(
        "MinIO is not ready on its own node",
        "`journalctl -u minio` on {node}: MINIO_VOLUMES in /etc/default/minio, disk space",
    ),
    "test_minio_serves_the_configured_certificate": Hint(
        "MinIO's certificate fails a client's check (name, CA, or not storage.tls.certificate)",
        "the error in the detail; the certificate must name storage.endpoint_url's host and chain "
        "to storage.tls.ca_certificate; `journalctl -u minio` on {node}; " + REDEPLOY,
    ),
    "test_minio_serves_no_plain_http": Hint(
        "storage.tls is set but MinIO answers plain http: its certificates are not loaded",
        "`ls -l /etc/minio/certs` and MINIO_OPTS (--certs-dir) in /etc/default/minio on {node}; " + REDEPLOY,
    ),
    "test_minio_certs_as_configured": Hint(
        "MinIO's certs directory differs from storage.tls (a stale copy of the private key, or "
        "not the configured pair)",
        "`ls -l /etc/minio/certs` on {node}; " + REDEPLOY,
    ),
    "test_storage_ca_trusted": Hint(
        "the node's system trust store differs from storage.tls.ca_certificate: the master, "
        "pg-backup or trial containers refuse MinIO's certificate",
        "/usr/local/share/ca-certificates/gpu-cluster-storage-ca.crt and `update-ca-certificates` "
        "on {node}; " + REDEPLOY,
    ),
    "test_minio_site_region_matches": Hint(
        "MinIO's region differs from storage.region: every checkpoint upload fails "
        "('Connection refused'-like errors)",
        "MINIO_SITE_REGION in /etc/default/minio = storage.region, no legacy MINIO_REGION; " + REDEPLOY,
    ),
    "test_bucket_exists_in_region": Hint(
        "checkpoint bucket missing or in another region, or MinIO refuses cluster.yaml's root "
        "keys (storage.access_key / secret_key changed on the server only)",
        REDEPLOY + " (creates the bucket); storage.region must be MinIO's site region; the "
        "cell's message names MinIO's answer",
    ),
    "test_master_env_has_region_and_keys": Hint(
        "the master's S3 environment (master-s3.env) is incomplete, or not in the running "
        "process: the master cannot download checkpoints",
        "`systemctl cat determined-master` on the master; `systemctl restart determined-master` "
        "after a change; " + REDEPLOY,
    ),
    "test_master_credentials_write_and_read": Hint(
        "checkpoint upload refused ('Permission denied'): S3 credentials or region",
        "try an S3 client against storage.endpoint_url with the master's keys (storage."
        "determined_user, derived secret); compare storage.secret_key / region, then " + REDEPLOY,
    ),
    "test_master_keys_are_determined_user_not_root": Hint(
        "master.yaml / master-s3.env hold MinIO's root keys (or another user's): every trial "
        "could delete any bucket and administer MinIO",
        "storage.determined_user in cluster.yaml; " + REDEPLOY + " (writes the scoped keys)",
    ),
    "test_determined_user_and_policy_as_deployed": Hint(
        "Determined's or pg-backup's MinIO user or policy differs from cluster.yaml (changed on "
        "the server, or the deploy did not finish): checkpoints or backups may be refused or too open",
        REDEPLOY + " (writes the policy, the user's secret and the mapping again)",
    ),
    "test_master_keys_confined_to_the_bucket": Hint(
        "the keys trials hold can do more than read/write the checkpoint bucket (another bucket, "
        "the admin API, or the database backups under backups/)",
        "`mc admin user info` / `mc admin policy info` for storage.determined_user; " + REDEPLOY,
    ),
    "test_console_listens_as_configured": Hint(
        "MinIO's console listens elsewhere than storage.console says",
        "MINIO_OPTS / MINIO_BROWSER in /etc/default/minio on {node}; " + REDEPLOY,
    ),
    "test_wrong_secret_refused": Hint(
        "MinIO accepted a wrong secret key: the bucket is not protected",
        "check the bucket's anonymous policy (`mc anonymous get`) and MinIO's root credentials",
    ),
    "test_secret_files_are_0600_root": Hint(
        "a secret file is missing or readable by others than root",
        "`ls -l /etc/default/minio /etc/determined/ /etc/pg-backup/` on {node}; " + REDEPLOY,
    ),
    "test_data_dir_is_mount_point": Hint(
        "storage.data_dir is not a mount point: MinIO would keep objects on the root disk (an "
        "unmounted data disk shows an empty bucket)",
        "`findmnt` on {node}: mount the data disk at storage.data_dir (and in /etc/fstab), then "
        + REDEPLOY
        + "; or set storage.data_on_root_disk: true if the root disk is intended",
    ),
    "test_backup_timer_active": Hint(
        "the nightly database backup is not scheduled, or its last run failed",
        "`systemctl list-timers pg-backup.timer` and `journalctl -u pg-backup` on {node}; "
        "`systemctl start pg-backup.service` runs one now; " + REDEPLOY,
    ),
    "test_latest_backup_recent": Hint(
        "no recent database backup: pg-backup.service's last run failed (its last journal line "
        "in the detail), its first run is overdue, or the newest backup is older than a night "
        "allows: a lost master loses its history",
        "`journalctl -u pg-backup` and `systemctl list-timers pg-backup.timer` on {node}; "
        "`pg-backup list` shows what the bucket holds; `systemctl start pg-backup.service` runs one now",
    ),
    "test_restore_drill_recent": Hint(
        "the newest database backup was not proven to restore lately: the last restore drill "
        "failed (what it found in the detail: a table or row count unlike the manifest written at "
        "dump time, a dump that does not restore), or none ran this week",
        "`cat /var/lib/pg-backup/last-drill.json`, `journalctl -u pg-backup-drill` and `systemctl "
        "list-timers pg-backup-drill.timer` on {node}; `python -m deploy restore-drill --cluster "
        "FILE` runs one now (docs/operations.md: restoring)",
    ),
    # --- test_determined.py -----------------------------------------------------------------
    "test_postgresql_version_and_connections": Hint(
        "PostgreSQL too old (< 13), max_connections < 96, or listening beyond localhost",
        "`runuser -u postgres -- psql -c 'SHOW server_version'` on {node}; " + REDEPLOY,
    ),
    "test_database_role_password_is_the_configured_one": Hint(
        "the master cannot log into PostgreSQL: the role's password is not database.password",
        REDEPLOY + " (sets the role's password); `journalctl -u determined-master`",
    ),
    "test_master_service": Hint(
        "determined-master is not running (port clash: another service holds the master port)",
        "`journalctl -u determined-master` on {node}: 'address already in use' means another "
        "service (Slurm, ...) holds master_port",
    ),
    "test_master_health_from_controller": Hint(
        "the master's /health does not answer 200 from the controller",
        "`journalctl -u determined-master` on the master (address already in use? DB login?); "
        "firewall on master_port",
    ),
    "test_master_health_on_node": Hint(
        "the master is not healthy on its own port: another service may hold the master port",
        "`journalctl -u determined-master` on {node} (address already in use); "
        "`ss -ltnp` for who listens on master_port",
    ),
    "test_master_yaml": Hint(
        "master.yaml has unknown keys (e.g. the article's checkpoint_storage.region: the master "
        "refuses to start) or differs from cluster.yaml",
        REDEPLOY + "; never add `region:` to checkpoint_storage (set AWS_DEFAULT_REGION)",
    ),
    "test_master_task_container_defaults": Hint(
        "the running master hands trials other task_container_defaults (image, fabric interface, "
        "/dev/infiniband, IPC_LOCK, shm) or checkpoint endpoint than cluster.yaml gives: "
        "master.yaml changed without a restart, or was edited by hand",
        REDEPLOY + " (it restarts the master when master.yaml changed)",
    ),
    "test_master_admin_password_is_the_configured_one": Hint(
        "the master refuses admin's login with determined.admin_password (changed after the "
        "first start, or a restored database): verify, rebuild and the deploy cannot log in",
        "re-run the deploy with DET_USER/DET_PASS set to an admin login that works: it sets "
        "admin's password to determined.admin_password",
    ),
    "test_master_refuses_blank_passwords": Hint(
        "a user of the master logs in with a blank password (a user added without one, or a "
        "master first started without security.initial_user_password)",
        "`det -u admin user change-password USER` (or `det -u admin user deactivate USER`) "
        "for each user the check names; " + REDEPLOY + " for admin",
    ),
    "test_trial_submitter_is_no_admin": Hint(
        "verify's smoke user (cluster-smoke) does not log in with the password the deploy left "
        "in /etc/determined/smoke-user.json, is inactive, or is an admin (then every smoke trial "
        "would hold an admin session token)",
        REDEPLOY + " (it creates or repairs cluster-smoke: no admin, active, that password)",
    ),
    "test_determined_user_inactive": Hint(
        "the built-in user determined is active (it was given admin's initial password)",
        REDEPLOY + " (it deactivates determined and gives it a random password)",
    ),
    "test_docker_with_nvidia_runtime": Hint(
        "Docker missing, older than 20.10, or without the nvidia runtime",
        "`docker info` on {node} (Runtimes); " + REDEPLOY + " (docker + nvidia-container-toolkit)",
    ),
    "test_agent_yaml": Hint(
        "agent.yaml has unknown keys, or master_host / master_port are not the master's",
        REDEPLOY + "; master_port defaults to 80 when agent.yaml omits it",
    ),
    "test_agent_service": Hint(
        "determined-agent is not running (per_domain nodes: a determined-agent@<i> instance)",
        "journalctl -u determined-agent on {node} (per_domain: -u 'determined-agent@*'); "
        "`systemctl status docker`",
    ),
    "test_agent_reaches_master_port": Hint(
        "the agent cannot connect to master_host:master_port",
        "`getent hosts MASTER` on {node} (/etc/hosts block); firewall; "
        "is the master listening (`ss -ltn` on the master)?",
    ),
    "test_master_knows_no_unnamed_agent": Hint(
        "an agent cluster.yaml does not name is registered and enabled: the master hands it "
        "trials, with their users' tokens and S3 keys (Determined does not authenticate agents)",
        "`det agent disable --drain AGENT` now (the address in the detail says where it runs); "
        "find who started it; a real node belongs in cluster.yaml, then " + REDEPLOY,
    ),
    "test_agent_registered_with_its_slots": Hint(
        "agent not registered with the master, or with the wrong number of slots",
        "journalctl -u determined-agent on {node}; master_port defaults to 80 when absent; "
        "`nvidia-smi -L` for the slots",
    ),
    # determined.tls (test_determined.py; each skips or checks for absence without it)
    "test_master_serves_the_configured_certificate": Hint(
        "the master's certificate fails a client's check (name master_host, CA, or not "
        "determined.tls.certificate)",
        "the error in the detail; `journalctl -u determined-master` on {node}; the certificate "
        "must name master_host and chain to determined.tls.ca_certificate; " + REDEPLOY,
    ),
    "test_master_serves_no_plain_http": Hint(
        "determined.tls is set but the master answers plain http: it runs without security.tls",
        "`grep -A3 tls: /etc/determined/master.yaml` and `systemctl restart determined-master` on "
        "{node} (it reads the certificate at start only); " + REDEPLOY,
    ),
    "test_master_certs_as_configured": Hint(
        "/etc/determined/certs on the master differs from determined.tls (a stale private key, "
        "another certificate, or master.yaml's security.tls not naming them)",
        "`ls -l /etc/determined/certs` on {node}; " + REDEPLOY,
    ),
    "test_agent_tls_as_configured": Hint(
        "the agent's security.tls or /etc/determined/certs/master-ca.crt differs from "
        "determined.tls: it cannot reach an https master, or trusts another CA",
        "`grep -A4 security: /etc/determined/agent*.yaml` on {node}; " + REDEPLOY,
    ),
    # --- test_topology_agents.py ------------------------------------------------------------
    "test_agents_registered_with_domain_slots": Hint(
        "the node's enabled agents are not one per NVLink domain (per_domain) or the one "
        "per-node agent, or their slots differ from the domains in `nvidia-smi topo -m`",
        "`systemctl list-units 'determined-agent*'` and `nvidia-smi topo -m` on {node}; "
        "journalctl -u 'determined-agent@*' on {node}; " + REDEPLOY,
    ),
    "test_agent_configs_cover_each_gpu_once": Hint(
        "the visible_gpus of {node}'s agent configs leave a GPU out, offer one twice, or do "
        "not follow its NVLink domains: trials may span domains or wait for slots forever",
        "compare /etc/determined/agent-*.yaml with `nvidia-smi topo -m` on {node} (a GPU "
        "fallen off the bus shows there first); " + REDEPLOY,
    ),
    "test_agent_units_match_layout": Hint(
        "agent units do not match agent_layout: a stale determined-agent@ instance, or the "
        "per-node determined-agent.service running beside per-domain agents (GPUs offered "
        "twice)",
        "`systemctl list-units --all 'determined-agent*'` on {node}; "
        + REDEPLOY
        + " (it stops and removes what the layout does not use)",
    ),
    "test_no_unexpected_agent_enabled": Hint(
        "an enabled agent that no node's layout and topology account for (stale agent from an "
        "earlier layout, or a node gone from cluster.yaml)",
        "GET /api/v1/agents; stop that agent's unit on its node (`systemctl disable --now`); "
        "a stopped agent stays listed as disabled for agent_reconnect_wait (25 s)",
    ),
    # --- test_health.py (docs/verify.md "Health"; "could not run" rows never drain a node) ---
    "test_gpu_count_and_model": Hint(
        "fewer GPUs than hardware.gpu_count, or another model: a GPU fell off the bus or is "
        "missing, or cluster.yaml describes another node class",
        "`nvidia-smi -L` and `lspci -d 10de:` on {node}: a GPU lspci shows but nvidia-smi does "
        "not has failed (reboot; then reseat or RMA); otherwise correct nodes[].hardware",
    ),
    "test_gpu_memory": Hint(
        "a GPU reports less memory than hardware.gpu_memory_mib (less 3%): another board "
        "(40 GB vs 80 GB) or retired memory",
        "`nvidia-smi --query-gpu=index,name,memory.total --format=csv` on {node}; a smaller "
        "board: correct hardware.preset / gpu_memory_mib; same board: RMA",
    ),
    "test_no_gpu_xid_since_boot": Hint(
        "the driver logged Xid events this boot (meaning per Xid in the evidence)",
        "`journalctl -k -b | grep 'NVRM: Xid'` on {node}; 79/48/64/95: drain (--drain-unhealthy), "
        "reboot, RMA if it recurs; 63/94: reset the GPU when idle (`nvidia-smi -r -i N`)",
    ),
    "test_no_uncorrectable_ecc_errors": Hint(
        "volatile uncorrectable ECC errors on a GPU: its memory corrupted data since the last reset",
        "drain {node} (--drain-unhealthy), reset the GPU (`nvidia-smi -r -i N`) or reboot; "
        "errors again after the reset: RMA",
    ),
    "test_no_pending_remaps_or_retirements": Hint(
        "a row remap or page retirement is pending (needs a GPU reset), or remapping failed "
        "(spare rows exhausted)",
        "pending: drain {node}, then `nvidia-smi -r -i N` or reboot; failed: RMA the GPU "
        "(`nvidia-smi -q -d ROW_REMAPPER,PAGE_RETIREMENT`)",
    ),
    "test_no_hardware_clock_throttling": Hint(
        "a GPU's clocks are cut by HW Slowdown (thermal or power brake): cooling, power supply or the board",
        "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER` on {node}; check fans, inlet "
        "temperature and PSUs; persists when idle: RMA",
    ),
    "test_pcie_links_at_max": Hint(
        "a GPU's PCIe link trained below its maximum width (or generation under load): "
        "host<->GPU copies run at a fraction",
        "`nvidia-smi -q -d PCI` and `lspci -vv -s BUS | grep LnkSta` on {node}; reseat the GPU "
        "or its riser, check BIOS PCIe settings, then reboot",
    ),
    "test_ib_ports_rate_and_width": Hint(
        "an InfiniBand port is missing, down, or trained below hardware.ib_rate_gbps / ib_width",
        "`ibstat` and `ibstatus` on {node}; reseat or replace the cable/transceiver, check the "
        "switch port (`iblinkinfo`); a different NIC class: correct nodes[].hardware",
    ),
    "test_ib_links_not_flapping": Hint(
        "an InfiniBand port's LinkDownedCounter rose between two reads: the link flaps",
        "`perfquery -C CA -P PORT` twice on {node}, `iblinkinfo` for the switch side; replace "
        "the cable or transceiver; `perfquery -R` resets the counters afterwards",
    ),
    "test_host_memory": Hint(
        "MemTotal differs from hardware.host_memory_gib by more than its tolerance: a DIMM "
        "failed or is missing",
        "`dmidecode -t memory` and the BMC's event log on {node}; replace the DIMM, or correct "
        "hardware.host_memory_gib",
    ),
    "test_cpu_count": Hint(
        "fewer logical CPUs than hardware.cpu_count: a socket, SMT or cores disabled",
        "`lscpu` on {node}; BIOS SMT/core settings, kernel `maxcpus=`/`nosmt` in "
        "/proc/cmdline; or correct hardware.cpu_count",
    ),
    "test_host_device_bandwidth": Hint(
        "host<->GPU copies slower than hardware.host_device_gbps",
        "run test_pcie_links_at_max first; then NUMA placement (`nvidia-smi topo -m`), BIOS "
        "PCIe/IOMMU settings on {node}",
    ),
    "test_nccl_allreduce_bandwidth": Hint(
        "NCCL all-reduce bus bandwidth below hardware.nccl_busbw_gbps across the node's GPUs",
        "`nvidia-smi nvlink -s` and `nvidia-smi topo -m` on {node}; fabric manager active on "
        "NVSwitch nodes; `NCCL_DEBUG=INFO all_reduce_perf ...` for the chosen transport",
    ),
    "test_ib_write_bandwidth": Hint(
        "ib_write_bw below hardware.ib_write_gbps on a port",
        "run test_ib_ports_rate_and_width first; then `ib_write_bw` against a known-good node "
        "to tell the port from the switch",
    ),
    # --- test_trial_container.py --------------------------------------------------------------
    "test_trial_image_cuda_within_driver": Hint(
        "the GPU image master.yaml hands trials needs a newer CUDA than the driver runs: "
        "nvidia-container-cli refuses it ('unsatisfied condition: cuda>=X'), or CUDA fails "
        "inside the trial (a CUDA 12 image on driver 515)",
        "`docker image inspect IMAGE` on {node} (NVIDIA_REQUIRE_CUDA, CUDA_VERSION) against "
        "`nvidia-smi`'s CUDA Version; name a CUDA 11.x image in determined.task_image.gpu (or "
        "undo a hand edit of /etc/determined/master.yaml), then " + REDEPLOY,
    ),
    "test_gpu_container_sees_gpus_and_cuda_initialises": Hint(
        "a `docker run --gpus all` trial container does not start, misses GPUs or the pinned "
        "driver, or cuInit fails in it (802: system not ready)",
        "802 on an NVSwitch node: `systemctl status nvidia-fabricmanager` and "
        "`journalctl -u nvidia-fabricmanager` on {node} (its version must be the driver's); "
        "a start error: the hook's message in the detail (`nvidia-container-cli info` on "
        "{node}); then " + REDEPLOY,
    ),
    "test_s3_round_trip_from_bridge_container": Hint(
        "a trial on Docker's bridge network cannot save a checkpoint: the endpoint master.yaml "
        "gives trials does not resolve or answer there, or the keys/region are refused",
        "bridge containers do not read the node's /etc/hosts: checkpoint_storage.endpoint_url "
        "in /etc/determined/master.yaml must be an address (`docker run --rm IMAGE getent "
        "hosts NAME` on {node}); region: AWS_DEFAULT_REGION in task_container_defaults; then " + REDEPLOY,
    ),
    "test_infiniband_in_trial_container": Hint(
        "trial containers do not get /dev/infiniband, or Docker refuses to create them because "
        "a device in task_container_defaults.devices is missing on the node",
        "`ls /dev/infiniband` and `/etc/init.d/openibd status` on {node} (MLNX_OFED's modules "
        "create the devices); task_container_defaults.devices in /etc/determined/master.yaml; "
        "then " + REDEPLOY,
    ),
    # --- test_smoke.py (a failure carries the hint that fits its message: smoke_client.py
    # failure_hint; these are what a red cell shows otherwise) ---------------------------------
    "test_smoke_trial_saves_a_checkpoint": Hint(
        "a trial cannot save a checkpoint to MinIO: region mismatch (AuthorizationHeaderMalformed), "
        "keys or policy ('Permission denied': SignatureDoesNotMatch, InvalidAccessKeyId, "
        "AccessDenied), or the endpoint unreachable from the container",
        "the S3 error in the detail; MINIO_SITE_REGION = storage.region; checkpoint_storage in "
        "/etc/determined/master.yaml (keys, endpoint_url an address); then " + REDEPLOY,
    ),
    "test_smoke_trial_restores_it": Hint(
        "a trial cannot read back the checkpoint another trial saved",
        "the S3 error in the detail (NoSuchKey: a lifecycle rule or another writer under the "
        "prefix; AccessDenied: the keys' policy lacks GetObject); then " + REDEPLOY,
    ),
    "test_smoke_two_agent_allreduce": Hint(
        "'AllReduce timeout': the ranks of a two-agent trial do not reach each other over the "
        "IPoIB interface (or rank 0 cannot ssh into the other container on port 12350)",
        "`ibstat`, `iblinkinfo`, `ip link show` of the IPoIB interface on both agents; a firewall "
        "(`iptables-save`); the trial's log lines in the detail; then " + REDEPLOY,
    ),
    "test_smoke_single_agent_allreduce": Hint(
        "the ranks of a trial with all the slots of one agent (one container on Docker's bridge "
        "network: eth0 and lo only) cannot allreduce: most often NCCL_SOCKET_IFNAME / "
        "GLOO_SOCKET_IFNAME name an interface such a container lacks ('Bootstrap : no socket "
        "interface found', 'Unable to find address for')",
        "the error in the detail; those variables in task_container_defaults of "
        "/etc/determined/master.yaml must reach multi-agent (host network) trials only; the task "
        "image's Open MPI / torch; then " + REDEPLOY,
    ),
}

FALLBACK = Hint(
    "check failed (no hint recorded for this check yet)",
    "read the check's assertion in the pytest output and its docstring in tests/verify/; "
    "then the node's journal (`journalctl -p err -b` on {node})",
)

# An n/p cell (tests/verify/matrix.py): the node answered SSH but its probe of its peers did not
# run, so none of its paths was tested. The usual cause is load: sshd opens the PAM session
# (pam_systemd waits for root's user manager, user@0.service) before it serves the channel.
NOT_PROBED = Hint(
    "not probed: the node answered SSH but its reachability probe did not run (not a broken "
    "path, not a dead node): its paths to its peers are untested",
    "the reason in the detail; a channel that did not open: load on {node} (`uptime`, "
    "`systemctl status user@0.service`, `journalctl -u ssh`), then run verify again; "
    "`python3: not found`: " + REDEPLOY,
)

# A node that cannot be reached over SSH: keyed by the reason's kind (see matrix.ssh_reason).
SSH_HINTS: dict[str, str] = {
    "refused": "node up but nothing on the SSH port: `systemctl status ssh` on its console; "
    "ssh.port in cluster.yaml",
    "unreachable": "no route to the node: is it powered on, cabled, in network.management?",
    "timeout": "node down, or a firewall drops SSH: ping it, check its console",
    "auth": "SSH login refused: ssh.user and ssh.key_file in cluster.yaml, authorized_keys on the node",
    "hostkey": "host key changed (reinstalled node?): update ssh.known_hosts_file",
    "resolve": "the node's address does not resolve: nodes[].address in cluster.yaml",
    "other": "`ssh -i KEY_FILE USER@ADDRESS true` from this machine (ssh.* in cluster.yaml)",
}


def hint_for(check: str, node: str = "") -> Hint:
    """The hint of `check` ("module.py::test_name" or "test_name"), FALLBACK if none."""
    name = check.rsplit("::", 1)[-1]
    hint = HINTS.get(check) or HINTS.get(name) or FALLBACK
    return hint.format(node or "the node")
