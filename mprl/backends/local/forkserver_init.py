"""The first module the local backend's forkserver imports (``FORKSERVER_PRELOAD``), and
nothing else imports it: the forkserver ignores SIGINT, SIGTERM and SIGHUP.

A Ctrl-C, a closed terminal or a ``kill -TERM -PGID`` reaches the whole process group, the
forkserver included, but only the main process decides what it means (a clean stop). A server
killed by one while the run still starts children would make the next start fail. It leaves
when the main process has gone (the end of its "alive" pipe), and the children forked from it
set their own signals first (:func:`mprl.backends.processes.init_child`).
"""

import signal

for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(_sig, signal.SIG_IGN)
