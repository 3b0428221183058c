"""The version of mprl (a leaf: the host and the checkpoints read it)."""

__version__ = "0.2.0"
