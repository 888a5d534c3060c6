# Lab stand-ins for the determined-master and determined-agent 0.38.0 packages (see build.py).
