import sys

if __name__ == "__main__":  # not in a spawned child, which imports this as __mp_main__
    from mprl import startup

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
