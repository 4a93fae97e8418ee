"""mkdocs hook: a root-absolute link in the docs (`/benchmarks/results/x.md`) must name a file of the repository.

mkdocs validates links between pages and anchors but leaves absolute links alone, and the docs cite the repository's
own files (recorded benchmark results, deploy/, source) that are not pages of the site. Those are written from the
repository's root, which is also how GitHub resolves them, and this hook fails the strict build when one names a
file or folder that does not exist (a result removed or renamed, a module moved).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

# A child of the "mkdocs" logger, so `mkdocs build --strict` counts its warnings.
log = logging.getLogger("mkdocs.hooks.repo_links")

# [text](/path) or [text](/path#anchor); fenced code blocks and inline code spans are dropped first.
LINK = re.compile(r"\]\((/[^)#\s]*)(?:#[^)\s]*)?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def repo_links(markdown: str) -> list[str]:
    """The root-absolute link targets of one page, outside code."""
    text = CODE_SPAN.sub("", FENCE.sub("", markdown))
    return LINK.findall(text)


def on_page_markdown(markdown, page, config, files):  # mkdocs passes these by name
    root = Path(config["config_file_path"]).parent
    for target in repo_links(markdown):
        if not (root / target.lstrip("/")).exists():
            log.warning("Doc file '%s' links to '%s', which is not a file of the repository", page.file.src_uri, target)
    return markdown
