"""Exceptions with a message meant for the user: each says what is wrong and how to fix it."""

from __future__ import annotations


class MprlError(Exception):
    """Base class of mprl's errors."""


class UsageError(MprlError):
    """Bad input (plugin name, env id, config value): nothing was started. The CLI exits 2."""


class ConfigError(UsageError):
    """A configuration value failed validation; the message names the field and what is allowed."""


class PluginError(UsageError):
    """A plugin is missing, failed to load, or broke a hook's contract; the message names it."""


class SchemaError(PluginError):
    """A shared-state schema declaration is wrong; the message names the field."""


class RunFailed(MprlError):
    """A child process of a run crashed. The CLI exits 1. ``summary`` says how far it got."""

    def __init__(self, message: str, summary: object = None) -> None:
        super().__init__(message)
        self.summary = summary
