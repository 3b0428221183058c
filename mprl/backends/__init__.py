"""Backends: where a run's processes live.

``base`` is the seam every backend implements (the job, its roles, the monitor, the outcome);
``supervisor`` the one supervisor of backends whose children run outside the main process (child
table, staggered start, restarts, hang detection, stop sequence); ``child`` the one child
runtime that runs a plugin's function on every backend (threads, seed, GPU learner, heartbeat,
crash report); ``processes`` what backends of operating-system processes share (child start-up,
the Manager server); ``inprocess`` Manager objects in the main process; ``restart`` the restart
policy. The core's backends are folders here, each a plugin the core registers (``local``:
spawned processes; ``serial``: one process, taking turns); Ray's, an optional extra, is the
built-in plugin ``mprl_builtin.ray``, on the same seam a third-party backend uses."""
