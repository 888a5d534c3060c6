# Stand-in for the distribution archive's linux-headers-<uname -r> package (lab only).
