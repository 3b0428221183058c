"""Deprecated: ``python -m mprl sweep`` is the built-in plugin ``mprl_builtin.sweep`` (its
modules ``spec``, ``runner`` and ``results``); a name imported from here warns, naming its new
place, and stops working in mprl 0.3.0."""

from mprl import deprecated

__getattr__ = deprecated.forward(__name__)
