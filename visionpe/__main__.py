"""``python -m visionpe COMMAND ...``: the ``visionpe`` command (:mod:`visionpe.cli.commands`)."""
from visionpe.cli.commands import main

if __name__ == "__main__":
    result = main()  # what the command returned, for callers that use runpy
