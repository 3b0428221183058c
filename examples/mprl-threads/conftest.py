"""Enables mprl's test fixtures and suites."""

pytest_plugins = ["mprl.testing"]
