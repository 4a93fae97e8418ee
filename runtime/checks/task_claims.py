"""A classifier's task, against the registry and the files beside it (issue #35): the task is one gptedge knows,
its template is that task's line (the paper's, with its special tokens, or the plain one without them), its head
is the one the line names, every special token the template uses is recorded and is the token the dir's
tokenizer_config.json declares for its role (an ordinary word edited in its place would be read as the extract
state and give confident nonsense), and the pad id lies inside the vocabulary. One line per problem, as model_claims'.
"""

from __future__ import annotations

from ..modeldir.manifest import MANIFEST_NAME, Manifest
from ..modeldir.tasks import (CHOICE, COMBINE_CHOICES, COMBINE_ONE, COMBINE_SUM, DECLARED_AS, READS, SPECIAL_ROLES,
                              plain_transformation, transformation)
from ..registry import TASKS

SAYS = f"{MANIFEST_NAME} says"
COMBINES = (COMBINE_ONE, COMBINE_SUM, COMBINE_CHOICES)


def _template(parts) -> str:
    return " | ".join(" ".join(seq) for seq in parts)


def task_problems(m: Manifest, tokenizer, declared: dict | None = None) -> list[str]:
    """declared: the dir's tokenizer_config.json (export writes the roles' tokens into it as transformers declares
    them: bos_token / sep_token / cls_token), which each recorded special id must be."""
    task = m.task
    if task is None:
        return []
    if task.name not in TASKS:
        return [f"{SAYS} task {task.name!r}, which is not one of {', '.join(TASKS)}: no runtime knows how to feed it"]
    problems = []
    entry, line = TASKS.entry(task.name), transformation(task.name)
    t = task.transformation
    plain = plain_transformation(task.name, t.reads != READS[0])
    unknown = [p for seq in t.sequences for p in seq if p not in (*SPECIAL_ROLES, *t.fields, CHOICE)]
    missing = [r for r in t.special_roles() if getattr(task.special_tokens, r) is None]
    if t.combine not in COMBINES:
        problems.append(f"{MANIFEST_NAME}'s task combines rows as {t.combine!r}, not one of {', '.join(COMBINES)}")
    if unknown:
        problems.append(f"{MANIFEST_NAME}'s task template names {unknown[0]!r}, neither a field "
                        f"({', '.join(t.fields)}) nor a special token")
    if missing:
        problems.append(f"{MANIFEST_NAME}'s task uses the {missing[0]} token but records no id for it")
    if t.reads not in READS:
        problems.append(f"{SAYS} the head reads the {t.reads!r} token, not one of {', '.join(READS)}")
    elif not problems and (t.fields, t.sequences, t.combine) not in ((line.fields, line.sequences, line.combine),
                                                                    (plain.fields, plain.sequences, plain.combine)):
        problems.append(f"{SAYS} task {task.name} with the template {_template(t.sequences)} ({t.combine}), which is "
                        f"neither {task.name}'s ({_template(line.sequences)}) nor its plain one "
                        f"({_template(plain.sequences)})")
    if task.head != entry.head:
        problems.append(f"{SAYS} task {task.name} on a {task.head} head; {task.name} runs on a {entry.head} head")
    vocab = m.shape.vocab_size
    if not 0 <= task.pad_id < vocab:
        problems.append(f"{SAYS} the task's pad id {task.pad_id}, outside the model's vocabulary (0..{vocab - 1})")
    for role in SPECIAL_ROLES:
        tid = getattr(task.special_tokens, role)
        if tid is None:
            continue
        if not 0 <= tid < vocab:
            problems.append(f"{SAYS} the {role} token is {tid}, outside the model's vocabulary (0..{vocab - 1})")
        elif tokenizer is not None and isinstance(declared, dict) and isinstance(declared.get(DECLARED_AS[role]), str):
            token, named = tokenizer.id_to_token(tid), declared[DECLARED_AS[role]]
            if token != named:
                problems.append(f"{SAYS} the {role} token is {tid}, which is {token!r} in tokenizer.json; "
                                f"tokenizer_config.json declares {named!r} ({DECLARED_AS[role]}) = "
                                f"{tokenizer.token_to_id(named)}")
    return problems
