"""``python -m streamproc.devstack.soak``: the same as ``scripts/soak``."""

from streamproc.devstack.soak.soak_command import soak

soak(prog_name="python -m streamproc.devstack.soak")
