"""``python -m streamproc.devstack.chaos``: the same command as ``streamproc chaos``."""

from streamproc.devstack.chaos.chaos_command import chaos

chaos(prog_name="python -m streamproc.devstack.chaos")
