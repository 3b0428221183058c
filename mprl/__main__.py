import signal
import sys

if __name__ == "__main__":  # not in a spawned child, which imports this as __mp_main__
    # a Ctrl-C while the command starts ends it as interrupted, with no traceback out of an
    # import (mprl.startup.guard_interrupts); one while mprl itself imports is held for it.
    # An ignored SIGINT (a background job) stays ignored
    held: list[int] = []
    guarded = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if guarded:
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))

    from mprl import startup

    if guarded:
        startup.guard_interrupts(interrupted=bool(held))

    # `python -m mprl run`: what the run's backend can start before this process imports torch
    # (the local backend's forkserver imports torch on another core meanwhile; the Ray
    # backend's Ray starts on this machine): nothing heavy is imported before this line
    startup.start_early(sys.argv[1:])

    import gc

    from mprl.tools.cli import main

    code = main()
    # the interpreter's last collection then skips what torch and the run made (a few tenths
    # of a second); everything is finalized as before, modules and files included
    gc.freeze()
    raise SystemExit(code)
