"""EnvPool (``--env-batch envpool``) for plugins: a worker's environments stepped in C++ by one
EnvPool (:func:`make_pool`), as :class:`mprl.lib.envbatch.EnvBatch` does. They are the env
room's, :mod:`mprl.environments.envpool`, which says what is supported."""

from mprl.environments.envpool import CLASSIC, INSTALL, check, make_pool, pool_spec

__all__ = ["CLASSIC", "INSTALL", "check", "make_pool", "pool_spec"]
