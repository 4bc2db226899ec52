"""``python -m streamproc.devstack.chaos``: the same command as ``streamproc chaos``."""

from streamproc.devstack.chaos.cli import chaos

chaos(prog_name="python -m streamproc.devstack.chaos")
