"""The command line's shared ground, below every workbench command (training, sweep, benchmarks, visualisation):

- :mod:`.convention`: one convention for every command (:class:`UserError`: one line, exit status 2; ``Parser``;
  ``--import`` of user code; :func:`run`);
- :mod:`.report`: the one writer of tables, figures and report documents;
- :mod:`.recipes`: the training recipes shipped with the package, by name;
- :mod:`.commands`: the table of the ``visionpe`` command's subcommands and its dispatcher.

It imports only the library: the commands are named in the table as ``module:function`` and imported when run.
"""
from .convention import (HelpFormatter, Parser, UserError, add_import, import_target, import_user_code, is_rank0,
                         one_line, run, user_errors)

__all__ = ["HelpFormatter", "Parser", "UserError", "add_import", "import_target", "import_user_code", "is_rank0",
           "one_line", "run", "user_errors"]
