"""Enables mprl's test fixtures (mprl_pm, mprl_recorder, mprl_serial, mprl_state, mprl_bench)."""

pytest_plugins = ["mprl.testing"]
