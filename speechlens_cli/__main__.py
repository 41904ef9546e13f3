"""The `speechlens` command's entry point (the console script and `python -m speechlens_cli`):
the process is prepared first (runtime.prepare: its BLAS must be loaded before anything imports
MLX, and importing the CLI does), then the Click group runs, given `args` and `kwargs` as
click's Group.main takes them (default: the command line)."""


def main(*args, **kwargs):
    from . import runtime

    runtime.prepare()
    from .cli import main as cli

    return cli(*args, **kwargs)


if __name__ == "__main__":
    main()
