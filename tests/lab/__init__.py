"""The lab: a multi-node cluster of real systemd machines on one host (see lab-recipe)."""
