"""Run at the start of every Python process a test starts (``tests/conftest.py`` puts this
folder on ``PYTHONPATH`` for the test): its multiprocessing semaphores are named after the test
(``/dev/shm/sem.mpt<TAG>-*``, from ``MPRL_TEST_MARK``), so the leak check knows which entries
of ``/dev/shm`` are the test's own, whatever else runs on the machine. Children started with
``spawn`` inherit the name prefix from their parent either way."""

import os

_mark = os.environ.get("MPRL_TEST_MARK")
if _mark:
    import multiprocessing.process

    multiprocessing.process.current_process()._config["semprefix"] = "/mpt" + _mark[:12]
