"""A classifier's task, against the registry and the files beside it (issue #35): the task is one gptedge knows,
its template is that task's line (the paper's, with its special tokens, or the plain one without them), its head
is the one the line names, every special token the template uses is recorded and is one of the tokenizer's
special tokens (an ordinary word in its place would be read as the extract state and give confident nonsense),
and the pad id lies inside the vocabulary. One line per problem, as model_claims'.
"""

from __future__ import annotations

from ..modeldir.manifest import MANIFEST_NAME, Manifest
from ..modeldir.tasks import READS, SPECIAL_ROLES, plain_transformation, transformation
from ..registry import TASKS

SAYS = f"{MANIFEST_NAME} says"


def _template(parts) -> str:
    return " | ".join(" ".join(seq) for seq in parts)


def task_problems(m: Manifest, tokenizer) -> list[str]:
    task = m.task
    if task is None:
        return []
    if task.name not in TASKS:
        return [f"{SAYS} task {task.name!r}, which is not one of {', '.join(TASKS)}: no runtime knows how to feed it"]
    problems = []
    entry, line = TASKS.entry(task.name), transformation(task.name)
    t = task.transformation
    plain = plain_transformation(task.name, t.reads != READS[0])
    if t.reads not in READS:
        problems.append(f"{SAYS} the head reads the {t.reads!r} token, not one of {', '.join(READS)}")
    elif (t.fields, t.sequences, t.combine) not in ((line.fields, line.sequences, line.combine),
                                                     (plain.fields, plain.sequences, plain.combine)):
        problems.append(f"{SAYS} task {task.name} with the template {_template(t.sequences)} ({t.combine}), which is "
                        f"neither {task.name}'s ({_template(line.sequences)}) nor its plain one "
                        f"({_template(plain.sequences)})")
    if task.head != entry.head:
        problems.append(f"{SAYS} task {task.name} on a {task.head} head; {task.name} runs on a {entry.head} head")
    vocab = m.shape.vocab_size
    if not 0 <= task.pad_id < vocab:
        problems.append(f"{SAYS} the task's pad id {task.pad_id}, outside the model's vocabulary (0..{vocab - 1})")
    specials = ({i: tok.content for i, tok in tokenizer.get_added_tokens_decoder().items() if tok.special}
                if tokenizer is not None else None)
    for role in SPECIAL_ROLES:
        tid = getattr(task.special_tokens, role)
        if tid is None:
            if role in t.special_roles():
                problems.append(f"{SAYS} task {task.name}'s template uses the {role} token but records no id for it")
            continue
        if not 0 <= tid < vocab:
            problems.append(f"{SAYS} the {role} token is {tid}, outside the model's vocabulary (0..{vocab - 1})")
        elif specials is not None and tid not in specials:
            token = tokenizer.id_to_token(tid)
            problems.append(f"{SAYS} the {role} token is {tid}, which is {token!r} in tokenizer.json, not one of its "
                            f"special tokens ({', '.join(f'{c!r} = {i}' for i, c in sorted(specials.items())[-4:])})")
    return problems
