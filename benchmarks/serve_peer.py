"""`benchmarks/serve_load.py --peer llama-server`: the same load against llama.cpp's own server (serve_load.py's
docstring says how llama-server is built, which GGUFs are made, and how the runs interleave)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serve_load import bench_model, load_prompts, measure_load, peak_rss_mib, stop_server
from serve_report import gptedge_column, order_columns, peer_column, render_report, report_json, write_atomic

SERVER_ENV = "GPTEDGE_LLAMA_SERVER"
BUILD_HINT = (f"set {SERVER_ENV} to a llama-server binary, built from llama-cpp-python's sdist: cmake -S "
              "SDIST/vendor/llama.cpp -B BUILD -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF "
              "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF && cmake --build BUILD --target llama-server -j, "
              f"then {SERVER_ENV}=BUILD/bin/llama-server")
# The request fields only llama-server gets: without it a slot reuses the KV of a prompt it saw before (this
# load sends prompts[0] at every client count), which gptedge never does.
PEER_BODY = {"cache_prompt": False}


def llama_server_binary() -> Path:
    where = os.environ.get(SERVER_ENV)
    if not where:
        raise SystemExit(f"--peer llama-server: {BUILD_HINT}")
    binary = Path(where).expanduser()
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        raise SystemExit(f"--peer llama-server: {SERVER_ENV}={where} is not an executable file; {BUILD_HINT}")
    return binary


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def recorded_weights(source) -> tuple[str | None, str | None]:
    """The weights file name and SHA-256 a manifest's source records (a quantized dir's through its fp32 dir)."""
    while source is not None:
        if source.sha256:
            return source.weights, source.sha256
        source = source.fp32_source
    return None, None


def checkpoint_work(checkpoint: Path, manifests: dict, work: Path) -> Path:
    """Where this checkpoint's GGUFs live: work/NAME-HASH, the hash over its files, so a different checkpoint (or
    this one rewritten) is converted afresh rather than served from a stale GGUF. A checkpoint whose weights are not
    the ones a gptedge dir records is refused: the two sides must serve the same weights."""
    digests = {f.name: sha256_file(f) for f in sorted(checkpoint.iterdir()) if f.is_file()}
    for model, manifest in manifests.items():
        weights, recorded = recorded_weights(manifest.source)
        if recorded and weights not in digests:
            raise SystemExit(f"--checkpoint {checkpoint}: no {weights}, the weights {model} was exported from")
        if recorded and digests[weights] != recorded:
            raise SystemExit(f"--checkpoint {checkpoint}: its {weights} is not the file {model} was exported from "
                             f"(SHA-256 {recorded[:12]}...)")
    key = hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:12]
    return work / f"{checkpoint.name}-{key}"


def peer_gguf(checkpoint: Path, recipe: str, work: Path, threads: int) -> Path:
    """work/model-RECIPE.gguf, made once with llama.cpp's converter and quantizer; each is made in a temporary dir
    and renamed into place, so an interrupted conversion never leaves a GGUF to be reused."""
    from gptedge.measure.peers.llama_cpp import convert_to_gguf, quantize_gguf

    work.mkdir(parents=True, exist_ok=True)
    f32, final = work / "model-f32.gguf", work / f"model-{recipe}.gguf"
    if not f32.exists():
        print(f"converting {checkpoint} to {f32}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(dir=work, prefix=".convert-") as tmp:
            os.replace(convert_to_gguf(checkpoint, Path(tmp)), f32)
    if recipe == "F32" or final.exists():
        return f32 if recipe == "F32" else final
    print(f"quantizing {f32.name} to {recipe}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=work, prefix=".quantize-") as tmp:
        staged = Path(tmp) / f32.name  # quantize_gguf writes beside its input
        staged.symlink_to(f32.resolve())
        os.replace(quantize_gguf(staged, recipe, threads), final)
    return final


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_server_command(binary: Path, gguf: Path | str, args, context: int, port: int | str) -> list[str]:
    """The issue's command line: -np the max batch gptedge gets, each slot the model's whole context."""
    return [str(binary), "-m", str(gguf), "-t", str(args.threads), "-tb", str(args.threads),
            "-np", str(args.max_batch), "-c", str(args.max_batch * context), "--host", "127.0.0.1",
            "--port", str(port), *args.peer_args]


def start_llama_server(cmd: list[str], url: str, log: Path) -> subprocess.Popen:
    import httpx

    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:  # 503 while the model loads
                return proc
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_server(proc)
    raise SystemExit(f"llama-server did not become healthy ({shlex.join(cmd)}):\n"
                     + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))


def bench_peer(binary: Path, gguf: Path, vocab_size: int, context: int, args) -> dict:
    import httpx

    prompts = load_prompts(vocab_size, args)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_llama_server(llama_server_command(binary, gguf, args, context, port), url, Path(tmp) / "log")
        try:
            meta = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0].get("meta", {})
            if meta.get("n_vocab", vocab_size) != vocab_size:
                raise SystemExit(f"{gguf} has {meta['n_vocab']} tokens, the gptedge dirs {vocab_size}")
            try:
                rows = measure_load(url, prompts, args, PEER_BODY)
            except httpx.HTTPError as e:  # the server died or hung up mid-load: say why, from its own log
                log_tail = "\n".join((Path(tmp) / "log").read_text(errors="replace").splitlines()[-20:])
                raise SystemExit(f"llama-server failed under the load ({type(e).__name__}: {e}; exit code "
                                 f"{proc.poll()}); the end of its log:\n{log_tail}") from None
            rss = peak_rss_mib(proc.pid)
        finally:
            stop_server(proc)
    return {"model": str(gguf), "rows": rows, "peak_rss_mib": rss, "size_mib": gguf.stat().st_size / 2**20}


def machine_facts(args, binary: Path, context: int) -> list[str]:
    import importlib.metadata

    import onnxruntime

    from gptedge import __version__

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    isa = [(f, f in flags) for f in ("avx2", "avx512f", "avx512_vnni")]
    isa.append(("amx", any(f.startswith("amx") for f in flags)))  # amx_tile, amx_int8, amx_bf16
    try:
        llama_py = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        llama_py = "absent"
    built = subprocess.run([str(binary), "--version"], check=False, capture_output=True, text=True, timeout=60)
    build = "; ".join(line.strip() for line in (built.stdout + built.stderr).splitlines()
                      if line.startswith(("version", "built with"))) or "unknown"
    return [f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`",
            f"- CPU: {cpu}; {os.cpu_count()} logical CPUs; ISA: "
            + ", ".join(f"{name} {'yes' if have else 'no'}" for name, have in isa),
            (f"- python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, gptedge {__version__}, "
            f"llama-cpp-python {llama_py}, llama.cpp {build}"),
            (f"- load: prompt {args.prompt} ids, new {args.new} (greedy, ignore_eos), {args.requests} requests per "
            f"client, clients {','.join(map(str, args.clients))}, {args.runs} runs interleaved"),
            f"- gptedge: `gptedge serve DIR --threads {args.threads} --max-batch {args.max_batch} --max-queue 256"
            f"{''.join(' ' + a for a in args.serve_args)}`",
            f"- llama-server: `{shlex.join(llama_server_command(binary, 'GGUF', args, context, 'PORT'))}`"]


def compare_with_peer(args) -> None:
    from gptedge.measure.peers.llama_cpp import FTYPES
    from gptedge.runtime.modeldir.manifest import read_manifest

    binary = llama_server_binary()
    bad = [r for r in args.peer_recipes if r not in FTYPES]
    if bad:
        raise SystemExit(f"--peer-recipes: {', '.join(bad)}: choose from {', '.join(FTYPES)}")
    manifests = {m: read_manifest(m) for m in args.models}
    shapes = {(m.shape.vocab_size, m.shape.context_length) for m in manifests.values()}
    if len(shapes) > 1:
        raise SystemExit("the gptedge dirs differ in vocabulary or context: they must come from one checkpoint")
    (vocab_size, context), = shapes
    recorded = manifests[args.models[0]].source.checkpoint
    checkpoint = args.checkpoint or (Path(recorded) if recorded else None)
    if checkpoint is None or not (checkpoint / "config.json").is_file():
        why = "not recorded in the manifest" if checkpoint is None else f"{checkpoint} has no config.json"
        raise SystemExit(f"--peer llama-server needs --checkpoint HF_DIR, the checkpoint the dirs were exported from "
                         f"({why})")
    work = checkpoint_work(checkpoint, manifests, args.work)
    ggufs = {r: peer_gguf(checkpoint, r, work, args.threads) for r in args.peer_recipes}
    ours = [gptedge_column(m, manifests[m]) for m in args.models]
    peers = [peer_column(r, ggufs[r]) for r in args.peer_recipes]
    columns = order_columns(ours, peers)
    facts = machine_facts(args, binary, context)
    for run in range(1, args.runs + 1):
        for col, model in zip(ours, args.models, strict=True):
            print(f"run {run}/{args.runs}: {col.name}", file=sys.stderr, flush=True)
            col.runs.append(bench_model(model, args, in_process=False))
        for col, recipe in zip(peers, args.peer_recipes, strict=True):
            print(f"run {run}/{args.runs}: {col.name}", file=sys.stderr, flush=True)
            col.runs.append(bench_peer(binary, ggufs[recipe], vocab_size, context, args))
        text = render_report(facts, columns, args.clients, args.new)
        if args.out:  # after every run, so a long session that dies keeps the runs it finished
            write_atomic(args.out, text)
            write_atomic(args.out.with_suffix(".json"), report_json(facts, columns))
    print(text, end="")
