"""Backends: where a run's processes live. ``base`` is the seam every backend implements and
what they share (roles, seeding, end conditions, failure wording), ``restart`` the restart policy,
``tensors`` the shared state built from tensors in this machine's memory; each backend is a
folder and a built-in plugin (``local``: spawned processes; ``serial``: one process, taking
turns)."""
