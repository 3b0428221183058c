"""Released code kept byte for byte, for tests/integration/test_compat.py to install and run as
its users would: never collected by this suite (its tests need it installed, and its own rootdir)."""

collect_ignore = ["mprl-reinforce-0.1.0"]
