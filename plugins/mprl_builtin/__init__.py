"""mprl's built-in plugins, one subpackage each (``mprl_builtin.dqn``, ``mprl_builtin.ppo`` ...),
registered through the ``mprl`` entry-point group of mprl's own ``pyproject.toml`` exactly as a
third-party plugin is.

They live under this one package so that no third-party module can collide with them: a
third-party plugin's module is ``mprl_<name>`` (docs/first-plugin.md), and the name
``mprl_builtin`` is reserved for mprl, as are the built-in plugin, algorithm and backend names
listed in docs/plugins.md ("Reserved names"). Nothing is imported here: each plugin is
imported by its entry point.
"""
