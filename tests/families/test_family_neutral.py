"""The registry claim (docs/families.md): a family is one export module plus its registry line; quantize/, the
runtime's generation and serving, and the HTTP server never name one. Checked on the code itself: no identifier and
no string that is not a docstring mentions a family (comments and docstrings may give GPT-2 as an example)."""

from __future__ import annotations

import ast

import pytest

from gptedge.runtime.registry import FAMILIES

from ..support.checkpoints import ROOT

NEUTRAL = ["quantize", "runtime/generation", "runtime/serving", "gptedge/serve"]
# the registry's names, spelt as code spells them, and the names the families go by
WORDS = sorted({n.lower().replace("-", "_") for n in FAMILIES} | {n.lower() for n in FAMILIES}
               | {"neox", "pythia", "qwen", "gpt_2", "gpt-2"})


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are a module's, class's or function's docstring."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def family_mentions(source: str) -> list[tuple[int, str]]:
    """(line, text) of each identifier or non-docstring string constant that mentions a family."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
        elif isinstance(node, ast.Name):
            text = node.id
        elif isinstance(node, ast.Attribute):
            text = node.attr
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            text = node.name
        elif isinstance(node, ast.arg):
            text = node.arg
        else:
            continue
        if any(w in text.lower() for w in WORDS) and "llama.cpp" not in text.lower():  # the peer engine, not a family
            found.append((node.lineno, text))
    return found


@pytest.mark.parametrize("folder", NEUTRAL)
def test_no_family_is_named_in_quantize_generation_or_serving(folder):
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files
    named = {f"{f.relative_to(ROOT)}:{line}": text for f in files
             for line, text in family_mentions(f.read_text(encoding="utf-8"))}
    assert named == {}


def test_the_check_sees_a_family_in_code_but_not_in_a_docstring():
    assert family_mentions('"""GPT-2 and Llama, as examples."""\nx = 1  # gpt2\n') == []
    assert family_mentions('if arch == "llama":\n    pass\n') == [(1, "llama")]
    assert family_mentions("def rope_for_neox(x):\n    return x\n") == [(1, "rope_for_neox")]
    assert family_mentions('s = "GPT-2 shaped"\n') == [(1, "GPT-2 shaped")]
