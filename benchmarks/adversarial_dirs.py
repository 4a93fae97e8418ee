"""Adversarial model dirs, re-runnable (issue #35): each case copies a good dir, breaks one thing, runs one gptedge
command on it, and judges the result. Cases are data (CASES below); the verdicts are printed as a table by verdict
and command. A case expects a refusal (exit 1 or 2, one `Error:` line); its verdicts:

    refused     exit 1 / 2 and one Error line                          (what every case wants)
    silent      exit 0: the command did its work on a broken dir       (a silent-wrong result)
    traceback   a Python traceback reached the user
    unclear     a non-zero exit with no one-line Error

    python benchmarks/adversarial_dirs.py --lm DIR --dynamic DIR --w4 DIR --classifier DIR [--work TMP] [--only ID]

--lm: an fp32 language-model dir as export writes it (with genai_config.json and tokenizer_config.json);
--dynamic / --w4: it quantized dynamic / weight-only 4-bit; --classifier: an entailment classifier dir (export
--task). The dirs are only read: every case works on a copy under --work (default: a temporary dir).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

MANIFEST = "gptedge.json"


def edit(name: str, change):
    """A breakage that loads the JSON file `name`, changes it, and writes it back."""
    def apply(d: Path) -> None:
        data = json.loads((d / name).read_text())
        change(data)
        (d / name).write_text(json.dumps(data))
    return apply


def flip_byte(d: Path) -> None:
    raw = bytearray((d / "model.onnx").read_bytes())
    raw[-5000] ^= 0x40
    (d / "model.onnx").write_bytes(bytes(raw))


def write(name: str, text: str):
    return lambda d: (d / name).write_text(text)


def swap_labels(m: dict) -> None:
    labels = m["task"]["id2label"]
    labels["0"], labels["1"] = labels["1"], labels["0"]


VERIFY = ["verify", "{d}", "--device", "cpu"]
PACK_WEB = ["pack", "{d}", "--target", "web", "-o", "{out}", "--no-page"]
PACK_MOBILE = ["pack", "{d}", "--target", "mobile", "-o", "{out}"]
# (id, source dir kind, breakage, command)
CASES = [
    ("flipped-weight-byte", "lm", flip_byte, PACK_WEB),
    ("flipped-weight-byte", "lm", flip_byte, PACK_MOBILE),
    ("flipped-weight-byte", "lm", flip_byte, VERIFY),
    ("files-list-deleted", "lm", edit(MANIFEST, lambda m: m.pop("files")), VERIFY),
    ("files-list-deleted", "lm", edit(MANIFEST, lambda m: m.pop("files")), ["generate", "{d}", "Hi", "-n", "2"]),
    ("model_file-dotdot", "lm", edit(MANIFEST, lambda m: m.update(model_file="../../x/model.onnx")), PACK_WEB),
    ("model_file-absolute", "lm", edit(MANIFEST, lambda m: m.update(model_file="/etc/passwd")), PACK_MOBILE),
    ("config-not-json", "lm", write("config.json", "{nope"), PACK_WEB),
    ("genai-eos-edited", "lm", edit("genai_config.json", lambda g: g["model"].update(eos_token_id=3)), VERIFY),
    ("genai-context-edited", "lm", edit("genai_config.json", lambda g: g["model"].update(context_length=9999)),
     VERIFY),
    ("model_max_length-edited", "lm", edit("tokenizer_config.json", lambda t: t.update(model_max_length=9999)),
     VERIFY),
    ("precision-fp32-over-int8", "dynamic", edit(MANIFEST, lambda m: (m.update(precision="fp32"),
                                                                      m.pop("quantization"))), PACK_WEB),
    ("per_channel-flipped", "dynamic", edit(MANIFEST, lambda m: m["quantization"].update(per_channel=False)), VERIFY),
    ("reduce_range-flipped", "dynamic", edit(MANIFEST, lambda m: m["quantization"].update(reduce_range=False)),
     VERIFY),
    ("accuracy_level-edited", "w4", edit(MANIFEST, lambda m: m["quantization"].update(accuracy_level=0)), VERIFY),
    ("labels-swapped", "classifier", edit(MANIFEST, swap_labels), VERIFY),
    ("extract-made-ordinary", "classifier", edit(MANIFEST, lambda m: m["task"]["special_tokens"].update(extract=464)),
     VERIFY),
    ("template-lost-extract", "classifier",
     edit(MANIFEST, lambda m: m["task"]["transformation"]["sequences"][0].pop()), VERIFY),
    ("task-renamed", "classifier", edit(MANIFEST, lambda m: m["task"].update(name="sentiment")), VERIFY),
]


def judge(done: subprocess.CompletedProcess) -> str:
    if "Traceback (most recent call last)" in done.stderr:
        return "traceback"
    if done.returncode == 0:
        return "silent"
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    return "refused" if done.returncode in (1, 2) and len(errors) == 1 else "unclear"


def run_case(case, sources: dict[str, Path], work: Path, n: int) -> tuple[str, str, str, str]:
    name, kind, breakage, command = case
    d = work / f"{n:03d}-{name}" / "d"
    shutil.copytree(sources[kind], d)
    breakage(d)
    args = [a.format(d=d, out=d.parent / "out") for a in command]
    done = subprocess.run([sys.executable, "-m", "gptedge.cli", *args], capture_output=True, text=True, timeout=900,
                          check=False)
    error = next((line for line in done.stderr.splitlines() if line.startswith("Error: ")), "")
    return name, command[0] + (f" --target {command[3]}" if command[0] == "pack" else ""), judge(done), error[:140]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for kind in ("lm", "dynamic", "w4", "classifier"):
        p.add_argument(f"--{kind}", type=Path, required=True)
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--only", default=None, help="run the cases with this id only")
    a = p.parse_args()
    sources = {k: getattr(a, k) for k in ("lm", "dynamic", "w4", "classifier")}
    work = a.work or Path(tempfile.mkdtemp(prefix="gptedge-adversarial-"))
    rows = [run_case(c, sources, work, i) for i, c in enumerate(CASES) if a.only in (None, c[0])]
    print("| case | command | verdict | error |\n|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    by = Counter((verdict, command) for _, command, verdict, _ in rows)
    print("\n| verdict | command | cases |\n|---|---|---|")
    for (verdict, command), count in sorted(by.items()):
        print(f"| {verdict} | {command} | {count} |")
    if a.work is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r[2] == "refused" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
