"""llama.cpp as a `compare --peers` engine (recipes Q8_0, Q4_K_M, Q4_0): the HF checkpoint -> an f32 GGUF ->
llama.cpp's own quantization.

guard -> convert -> quantize -> load, as a llama.cpp user does it:
1. `convert_hf_to_gguf.py`, the converter that ships in llama-cpp-python's source distribution
   (`vendor/llama.cpp/`; the wheel has only the `llama_cpp` package), writes an f32 GGUF of the same
   checkpoint the other rows came from. Where it is: $GPTEDGE_LLAMA_CPP_SOURCE, the sdist archive
   (`llama_cpp_python-X.tar.gz`, unpacked into the work dir), its unpacked folder, a llama.cpp checkout,
   or the script itself. It runs in a subprocess with this Python (it needs torch and transformers,
   which `gptedge[test]` has, and its own `gguf-py` beside it, else `pip install gguf`).
   One change to it: a BPE pre-tokenizer it does not recognise (the sample model's own tokenizer) is
   written as "gpt-2" instead of failing. compare feeds llama.cpp token ids, never text, so the
   pre-tokenizer is never used.
2. `llama_cpp.llama_model_quantize` (llama-quantize's API) makes Q8_0 / Q4_K_M / Q4_0 from the f32 GGUF,
   with llama.cpp's own choices per tensor (e.g. Q4_K_M keeps the tied embedding / output at q6_K).
3. Scoring: a `Llama` with `logits_all=True` evaluates a window's ids and hands back every position's
   logits; greedy decoding runs `Llama.generate` (temp 0: llama.cpp's greedy sampler) on a second `Llama`
   loaded as users load one (last-position logits only). Both keep llama.cpp's defaults otherwise
   (f16 KV cache), with n_ctx the checkpoint's context and `threads` threads.
"""

from __future__ import annotations

import ctypes
import io
import json
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
from contextlib import contextmanager, redirect_stderr
from pathlib import Path

import numpy as np

from gptedge.runtime.errors import PeerError

from .base import Greedy, PeerEngine, PeerInfo, ScoreJob, timed_greedy

log = logging.getLogger(__name__)

SOURCE_ENV = "GPTEDGE_LLAMA_CPP_SOURCE"
CONVERTER = "convert_hf_to_gguf.py"
# llama_ftype names in llama_cpp (llama.h's LLAMA_FTYPE_*); "F32" is the converter's output itself.
FTYPES = {"Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
          "F32": "LLAMA_FTYPE_ALL_F32"}
PRECISIONS = {"Q8_0": "int8", "Q4_K_M": "int4", "Q4_0": "int4", "F32": "fp32"}

# Runs the converter's main() with its pre-tokenizer check made tolerant (see the module docstring).
_CONVERT = r"""
import sys
from pathlib import Path

converter, source, outfile = sys.argv[1:4]
sys.path.insert(0, str(Path(converter).parent))
sys.argv = [converter, source, "--outfile", outfile, "--outtype", "f32"]
import convert_hf_to_gguf as cli  # puts its own gguf-py on sys.path

def tolerant(get_pre):
    def pre(self, tokenizer):
        try:
            return get_pre(self, tokenizer)
        except NotImplementedError:  # an unknown BPE pre-tokenizer: gptedge feeds ids, never text
            return "gpt-2"
    return pre

classes = [getattr(cli, name) for name in ("TextModel", "Model") if hasattr(cli, name)]
try:
    import conversion.base  # llama.cpp >= late 2025 keeps the model classes in a package beside the script
    classes.append(conversion.base.TextModel)
except ImportError:
    pass
for cls in classes:
    if "get_vocab_base_pre" in vars(cls):
        cls.get_vocab_base_pre = tolerant(cls.get_vocab_base_pre)
cli.main()
"""


@contextmanager
def llama_log_to_info():
    """llama.cpp's own log (fallback quantizations, context notes) reaches stderr whatever llama-cpp-python's
    verbose says, through fd 2 (the C side) or sys.stderr (llama_cpp's log callback): hold both and pass
    them on as INFO lines (`gptedge -v`)."""
    sys.stderr.flush()
    saved = os.dup(2)
    printed = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as held:
        os.dup2(held.fileno(), 2)
        try:
            with redirect_stderr(printed):
                yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in (held.read().decode("utf-8", "replace") + printed.getvalue()).splitlines():
                if line.strip():
                    log.info("llama.cpp: %s", line)


def converter_hint() -> str:
    return (f"llama.cpp's {CONVERTER} was not found: it ships in llama-cpp-python's source distribution; "
            f"`pip download --no-deps --no-binary :all: llama-cpp-python==VERSION -d DIR` (the installed version), "
            f"then {SOURCE_ENV}=DIR/llama_cpp_python-VERSION.tar.gz")


def converter_source() -> Path | None:
    """Where $GPTEDGE_LLAMA_CPP_SOURCE says the converter is (an archive is returned as it is), or None."""
    where = os.environ.get(SOURCE_ENV)
    if not where:
        return None
    p = Path(where).expanduser()
    if p.is_file() and (p.name == CONVERTER or p.name.endswith((".tar.gz", ".tgz"))):
        return p
    if p.is_dir():
        for candidate in (p / CONVERTER, p / "vendor" / "llama.cpp" / CONVERTER,
                          *p.glob(f"*/vendor/llama.cpp/{CONVERTER}")):
            if candidate.is_file():
                return candidate
    return None


def unpack_converter(archive: Path, work: Path) -> Path:
    """The converter, its `conversion` package and `gguf-py` out of an sdist archive, into work/llama.cpp."""
    out = work / "llama.cpp"
    with tarfile.open(archive) as tar:
        members = []
        for m in tar.getmembers():
            parts = m.name.split("/")
            if len(parts) > 3 and parts[1:3] == ["vendor", "llama.cpp"] and (
                    parts[3] == CONVERTER or parts[3] in ("conversion", "gguf-py")) and (m.isfile() or m.isdir()):
                m.name = "/".join(parts[3:])
                members.append(m)
        if not any(m.name == CONVERTER for m in members):
            raise PeerError(f"{archive} holds no vendor/llama.cpp/{CONVERTER}: not llama-cpp-python's sdist")
        tar.extractall(out, members=members, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return out / CONVERTER


def with_n_ctx(source: Path, work: Path) -> Path:
    """The converter reads GPT-2's context from config.json's `n_ctx`, which transformers no longer writes
    (only `n_positions`): a checkpoint without it is linked into work/llama-source with it added."""
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    if "n_ctx" in config or "n_positions" not in config:
        return source
    linked = work / "llama-source"
    linked.mkdir()
    for f in source.iterdir():
        if f.name != "config.json":
            (linked / f.name).symlink_to(f.resolve())
    (linked / "config.json").write_text(json.dumps({**config, "n_ctx": config["n_positions"]}), encoding="utf-8")
    return linked


def convert_to_gguf(source: Path, work: Path) -> Path:
    """The checkpoint as an f32 GGUF under work (once)."""
    out = work / "model-f32.gguf"
    if out.exists():
        return out
    where = converter_source()
    if where is None:
        raise PeerError(converter_hint())
    converter = where if where.name == CONVERTER else unpack_converter(where, work)
    log.info("llama.cpp: converting %s with %s", source, converter)
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(converter), str(with_n_ctx(source, work)), str(out)],
                          capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        last = lines[-1] if lines else str(done.returncode)
        raise PeerError(f"llama.cpp's {CONVERTER} failed on {source}: {last}{_missing_file_hint(last, source)}")
    return out


def _missing_file_hint(last: str, source: Path) -> str:
    """Why a converter that wants a SentencePiece tokenizer.model fails on a checkpoint that has tokenizer.json only:
    for some families (Gemma) it reads the vocabulary from the .model file, not the JSON one."""
    if "tokenizer.model" not in last or (source / "tokenizer.model").exists():
        return ""
    return (" (llama.cpp reads this family's vocabulary from the SentencePiece tokenizer.model its checkpoints ship; "
            "put it beside tokenizer.json)")


def quantize_gguf(f32: Path, recipe: str, threads: int) -> Path:
    """llama.cpp's quantization of the f32 GGUF (llama-quantize's defaults for the type)."""
    import llama_cpp

    if recipe == "F32":
        return f32
    out = f32.with_name(f"model-{recipe}.gguf")
    if out.exists():
        return out
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[recipe])
    params.nthread = threads
    with llama_log_to_info():
        rc = llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0 or not out.is_file():
        raise PeerError(f"llama.cpp could not quantize {f32.name} to {recipe} (llama_model_quantize returned {rc})")
    return out


class LlamaCppScorer:
    """One GGUF in llama-cpp-python, as compare's Scorer."""

    resolved = None

    def __init__(self, gguf: Path, recipe: str, threads: int, vocab_size: int, context_length: int):
        import llama_cpp
        from llama_cpp import Llama

        options = dict(n_ctx=context_length, n_batch=context_length, n_ubatch=context_length, n_threads=threads,
                       n_threads_batch=threads, verbose=False)
        with llama_log_to_info():
            self.scoring = Llama(str(gguf), logits_all=True, **options)  # every position's logits
            self.decoding = Llama(str(gguf), **options)  # as users load it: the last position's logits only
        if self.scoring.n_vocab() != vocab_size:
            raise PeerError(f"llama.cpp's {gguf.name} has {self.scoring.n_vocab()} tokens, the checkpoint {vocab_size}")
        self.vocab_size, self.context_length = vocab_size, context_length
        # Warm the decoding context (its first run allocates buffers): the other engines score the windows with
        # the very model they then decode with, so their first timed continuation starts warm too.
        self.greedy([0], 2, None)
        self.info = PeerInfo(f"llama.cpp {recipe}", f"llama-cpp-python {llama_cpp.__version__}", PRECISIONS[recipe],
                             f"llama.cpp {recipe}", gguf.stat().st_size)

    def logits(self, ids: np.ndarray) -> np.ndarray:
        self.scoring.reset()
        self.scoring.eval(ids.tolist())
        return np.array(self.scoring.scores[:len(ids)], dtype=np.float32)  # (L, V)

    def greedy(self, prompt: list[int], max_new_tokens: int, eos_id: int | None) -> Greedy:
        tokens = self.decoding.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                        reset=True)
        try:
            return timed_greedy(tokens, max_new_tokens, eos_id)
        finally:
            tokens.close()


def scorer(recipe: str, job: ScoreJob) -> LlamaCppScorer:
    if recipe not in FTYPES:
        raise PeerError(f"unknown llama.cpp recipe {recipe!r}: choose from {', '.join(FTYPES)}")
    gguf = quantize_gguf(convert_to_gguf(job.source, job.work), recipe, job.threads)
    return LlamaCppScorer(gguf, recipe, job.threads, job.vocab_size, job.context_length)


def missing_converter() -> str | None:
    return None if converter_source() is not None else converter_hint()


ENGINE = PeerEngine("llama.cpp", needs=("llama_cpp", "torch", "transformers"), install="llama.cpp",
                    missing=missing_converter, recipes=("Q8_0", "Q4_K_M", "Q4_0"), scorer=scorer)
