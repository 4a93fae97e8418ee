"""What the adversarial pass (adversarial.py) runs on: tiny seeded models built from code (a GPT-2 of context 128,
its kv_buffer, dynamic-INT8, weight-only 4-bit and mobile variants, an entailment classifier from transformers'
GPT2ForSequenceClassification) and the shipped Llama sample, the text files the commands read, and two servers.
Everything under inputs/ is protected: a case that changes or removes a file there is judged data-loss."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_ARGS = ("--max-body", "65536", "--max-tokens-limit", "64", "--web", "off", "--device", "cpu")


class Context:
    def __init__(self, work: Path):
        self.work = Path(work)
        self.inputs = self.work / "inputs"
        self.cases = self.work / "cases"
        self.paths: dict[str, str] = {}
        self.servers: dict = {}
        self.models: dict = {}
        self.protected = [self.inputs]
        self._n = 0

    def p(self, name: str) -> Path:
        return Path(self.paths[name])

    def build(self) -> None:
        from gptedge.export.exporter import export_checkpoint
        from gptedge.export.head_export import export_task
        from gptedge.pack.mobile import write_mobile_model
        from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir
        from tests.support.checkpoints import EXCERPT, tiny_reference, write_checkpoint
        from tests.support.task_checkpoints import make_checkpoint

        i = self.inputs
        built = (i / "built").is_file()
        i.mkdir(parents=True, exist_ok=True)
        self.cases.mkdir(exist_ok=True)
        names = ["ck", "lm", "kvb", "dyn", "w4", "llama", "clsck", "cls", "mob", "earlier", "otherdyn"]
        self.paths.update({n: str(i / n) for n in names})
        if not built:
            write_checkpoint(tiny_reference("gpt2"), i / "ck")
            export_checkpoint(i / "ck", i / "lm")
            export_checkpoint(i / "ck", i / "kvb", graph_variant="kv_buffer")
            quantize_model_dir(i / "lm", i / "dyn", QuantizeRecipe(method="dynamic"))
            quantize_model_dir(i / "lm", i / "w4", QuantizeRecipe(method="weight-only", bits=4))
            export_checkpoint(ROOT / "samples" / "sample-llama", i / "llama")
            make_checkpoint("gpt2-seq", i / "clsck")
            export_task(i / "clsck", i / "cls", task="entailment")
            (i / "mob").mkdir()
            write_mobile_model(i / "lm", i / "mob")
            (i / "earlier").mkdir()
            (i / "earlier" / "notes.txt").write_text("an earlier output the user keeps\n")
        if not (i / "otherdyn").is_dir():  # built apart: a work dir kept from an earlier pass gains it
            # the GPT-2 of `lm`'s shape and tokenizer with other weights (another checkpoint), as dynamic INT8: with
            # `lm` (fp32) it is two dtypes of what a web site would present as one model
            write_checkpoint(tiny_reference("gpt2", seed=9), i / "otherck")
            export_checkpoint(i / "otherck", i / "otherfp32", validate=False)
            quantize_model_dir(i / "otherfp32", i / "otherdyn", QuantizeRecipe(method="dynamic"))
        text = EXCERPT.read_text(encoding="utf-8")
        files = {
            "text": text[:4000], "long_text": text, "empty": "", "one_word": "Hello",
            "u2028": "line one\u2028still line one\nline two\n",
            "jsonl": "".join(json.dumps(r) + "\n" for r in [
                {"premise": "A man sleeps.", "hypothesis": "A person rests.", "label": "entailment"},
                {"premise": "It rains.", "hypothesis": "It is dry\u2028outside.", "label": "contradiction"},
                {"premise": "Dogs bark.", "hypothesis": "Cats\u0085meow.", "label": "neutral"}]),
            "jsonl_bad_line": '{"premise": "a", "hypothesis": "b", "label": "neutral"}\n{nope\n',
            "jsonl_missing_field": '{"premise": "a"}\n',
            "jsonl_unknown_label": '{"premise": "a", "hypothesis": "b", "label": "maybe"}\n',
            "jsonl_empty": "", "jsonl_blank_lines": "\n\n\n",
            "jsonl_array": '["a", "b"]\n', "jsonl_deep": "[" * 100000 + "]" * 100000 + "\n",
            "calib": text[:3000],
        }
        for name, content in files.items():
            path = i / f"{name}.txt"
            if not built:
                path.write_text(content, encoding="utf-8")
            self.paths[name] = str(path)
        binary = i / "binary.txt"
        if not built:
            binary.write_bytes(b"\xff\xfe\x00bad \xc3( bytes")
            (i / "built").write_text("ok\n")
        self.paths["binary"] = str(binary)
        self.paths["missing"] = str(i / "no-such-thing")
        self.paths["llama_src"] = str(ROOT / "samples" / "sample-llama")

    def model(self, name: str):
        """The model dir `name` loaded once in process (the API cases and the oracles share it)."""
        if name not in self.models:
            from gptedge.runtime import load

            self.models[name] = load(self.paths[name], device="cpu")
        return self.models[name]

    def new_case_dir(self, case) -> Path:
        """A fresh scratch dir for the case: {tmp} in its arguments, {out} a path inside it not yet made."""
        self._n += 1
        d = self.cases / f"{self._n:03d}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        self.paths["tmp"], self.paths["out"] = str(d), str(d / "out")
        return d

    def tampered(self, source: str, breakage) -> Path:
        """A copy of the model dir `source` in the case's scratch dir with one thing broken."""
        d = Path(self.paths["tmp"]) / "d"
        shutil.copytree(self.paths[source], d)
        breakage(d)
        self.paths["d"] = str(d)
        return d

    def start_servers(self, wanted: bool) -> None:
        if not wanted:
            return
        from tests.support.server import start_server

        self.servers["gpt2"] = start_server(self.p("lm"), self.work / "serve-gpt2.log", *SERVER_ARGS)
        self.servers["llama"] = start_server(self.p("llama"), self.work / "serve-llama.log", *SERVER_ARGS)

    def stop_servers(self) -> list[dict]:
        """Stop the servers -> one row each: its log must hold no traceback."""
        from tests.support.server import stop_server

        rows = []
        for name, server in self.servers.items():
            stop_server(server.proc)
            log = server.log.read_text(errors="replace")
            bad = "Traceback (most recent call last)" in log
            rows.append(dict(id=f"server-log-{name}", command="serve", expect="ok",
                             verdict="traceback" if bad else "ok", detail=log[-200:] if bad else "", seconds=0))
        return rows
