import sys

if __name__ == "__main__":  # not in a spawned child, which imports this as __mp_main__
    from mprl.backends import forkserver, ray_start

    # `python -m mprl run`: the children's forkserver imports torch on another core while
    # this process does, or Ray starts on this machine meanwhile (`--backend ray`; nothing
    # heavy is imported before this line)
    forkserver.start_early(sys.argv[1:]) or ray_start.start_early(sys.argv[1:])

    import gc

    from mprl.tools.cli import main

    code = main()
    # the interpreter's last collection then skips what torch and the run made (a few tenths
    # of a second); everything is finalized as before, modules and files included
    gc.freeze()
    raise SystemExit(code)
