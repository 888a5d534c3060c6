"""The logins of the site mirror and the apt proxy: optional secrets of `sources` (sources.py).

Each is `user:password` in a secret file or variable, never in a URL (checks.url refuses
userinfo): roles/apt/proxy.py writes them into root-only files that apt and curl read.
"""

from deploy.cluster.keys import SecretKey
from deploy.secrets import credentials_problem

APT_PROXY = SecretKey(
    "the apt proxy's login",
    "`user:password` for `apt_proxy`: into a root-only apt auth.conf.d file on the nodes, "
    "never into a URL, command line or log",
    optional=True,
    content=credentials_problem,
)
MIRROR = SecretKey(
    "the site mirror's login",
    "`user:password` for the site mirror that serves `cuda_repo`: apt logins to its scheme, host "
    "and port, and every other download from that host, from root-only files on the nodes "
    "(never a URL, command line or log); not for NVIDIA's own server",
    optional=True,
    content=credentials_problem,
)
