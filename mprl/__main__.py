import sys

if __name__ == "__main__":  # not in a spawned child, which imports this as __mp_main__
    from mprl.backends import forkserver

    # `python -m mprl run`: the children's forkserver imports torch on another core while
    # this process does (nothing heavy is imported before this line)
    forkserver.start_early(sys.argv[1:])

    from mprl.tools.cli import main

    raise SystemExit(main())
