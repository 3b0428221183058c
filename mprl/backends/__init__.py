"""Backends: where a run's processes live.

``base`` is the seam every backend implements (the job, its roles, the monitor, the outcome);
``supervisor`` the one supervisor of backends whose children run outside the main process (child
table, staggered start, restarts, hang detection, stop sequence); ``child`` the one child
runtime that runs a plugin's function on every backend (threads, seed, GPU learner, heartbeat,
crash report); ``processes`` what backends of operating-system processes share (child start-up,
the Manager server); ``restart`` the restart policy; ``tensors`` the shared state built from
tensors in this machine's memory. Each backend is a folder and a built-in plugin (``local``:
spawned processes; ``serial``: one process, taking turns; ``ray``: Ray actors)."""
