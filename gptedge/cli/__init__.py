"""The `gptedge` command: generated text on stdout, diagnostics (load time, tok/s, provider) on stderr.

One module per command; each registers its click command on the group (group.py) with `@command()`, and
is imported once below: a new command is its module plus one line here. Shared options (--device,
--threads, counts, UTF-8 text, records built from groups of options) are in options.py, so every command
checks them the same way; every failure is one `Error: ...` line with one set of exit codes (errors.py).
"""

# One line a command: importing its module registers it on `main` (`gptedge --help` lists them sorted).
from . import bench  # noqa: F401 - imported to register its command
from . import classify  # noqa: F401 - imported to register its command
from . import compare  # noqa: F401 - imported to register its command
from . import evaluate  # noqa: F401 - imported to register its command
from . import export  # noqa: F401 - imported to register its command
from . import fetch_web  # noqa: F401 - imported to register its command
from . import generate  # noqa: F401 - imported to register its command
from . import info  # noqa: F401 - imported to register its command
from . import pack  # noqa: F401 - imported to register its command
from . import quantize  # noqa: F401 - imported to register its command
from . import serve  # noqa: F401 - imported to register its command
from . import verify  # noqa: F401 - imported to register its command
from .group import main

__all__ = ["main"]
