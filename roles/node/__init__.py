"""Every node's base: preflight checks, /etc/hosts, no firewall between nodes."""
