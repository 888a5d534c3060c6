"""Determined: the master, the agents and their per-domain units, users, TLS, the agents' Docker
and the task images. Files: files/determined/.
"""
