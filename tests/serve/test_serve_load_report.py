"""benchmarks/serve_load.py's --peer llama-server report (its serve_report.py), from result dicts: the SSE parsing of
both servers' streams, the column names from manifests, the table, the target judgement and the JSON. No server, no
llama.cpp."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

from gptedge.runtime.modeldir.manifest import Manifest, ModelShape, Quantization, Source

from ..support.checkpoints import ROOT


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "benchmarks" / "serve_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("serve_load", module)  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


sl = _load_benchmark()
sp = importlib.import_module("serve_peer")  # its llama-server half, beside it (serve_load put the folder on the path)
sr = sys.modules["serve_report"]  # the report half, imported by serve_peer

SHAPE = ModelShape("gpt2", 2, 2, 4, 64, 32)


def _data(chunk: dict) -> str:
    return "data: " + json.dumps(chunk)


# A llama-server /v1/completions stream as recorded from its build b1-0c1e570 (fields trimmed): one chunk per token
# with text, then a last chunk with an empty text, `usage` and `timings`, then [DONE]. Here one token ended inside a
# UTF-8 character, so its text came with the next token's: 4 tokens, 3 chunks with text.
_META = {"created": 1795604228, "model": "model-f32.gguf", "system_fingerprint": "b1-0c1e570",
         "object": "text_completion", "id": "chatcmpl-gNH0jQ3EJb4rtrASHl5rCh2oUEOXqscb"}
LLAMA_STREAM = [
    *[line for text in (" the", " caf\u00e9", " sat")
      for line in (_data({"choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": None}], **_META}),
                   "")],
    _data({"choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}], **_META,
           "usage": {"completion_tokens": 4, "prompt_tokens": 8, "total_tokens": 12,
                     "prompt_tokens_details": {"cached_tokens": 0}},
           "timings": {"cache_n": 0, "prompt_n": 8, "prompt_ms": 5.213, "predicted_n": 4, "predicted_ms": 10.941}}),
    "",
    "data: [DONE]",
    "",
]


def test_a_llama_server_stream_is_read_as_the_servers_own_token_count_and_text_arrivals():
    timing = sl.parse_stream(10.0, [(10.0 + 0.1 * i, line) for i, line in enumerate(LLAMA_STREAM, start=1)])
    assert timing.tokens == 4 and timing.counted_by == "usage"
    assert timing.chunks == pytest.approx([10.1, 10.3, 10.5])  # the last chunk's empty text is not an arrival
    assert timing.ttft == pytest.approx(0.1) and timing.gaps == pytest.approx([0.2, 0.2])


def test_without_usage_the_count_is_timings_predicted_n_then_the_text_chunks():
    no_usage = [line.replace('"usage"', '"other"') for line in LLAMA_STREAM]
    timing = sl.parse_stream(0.0, enumerate(no_usage))
    assert (timing.tokens, timing.counted_by) == (4, "timings")
    bare = [line for line in no_usage if "timings" not in line]
    timing = sl.parse_stream(0.0, enumerate(bare))
    assert (timing.tokens, timing.counted_by) == (3, "chunks")


def test_a_gptedge_stream_still_counts_its_usage_chunk():
    lines = [_data({"choices": [{"text": "a", "index": 0}]}), _data({"choices": [{"text": "b", "index": 0}]}),
             _data({"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 3, "total_tokens": 5}}),
             "data: [DONE]"]
    timing = sl.parse_stream(0.0, [(1.0, lines[0]), (2.0, lines[1]), (2.5, lines[2]), (2.6, lines[3])])
    assert (timing.tokens, timing.chunks) == (2, [1.0, 2.0])


def test_an_error_event_in_the_stream_raises():
    with pytest.raises(RuntimeError, match="exceeds the available context"):
        sl.parse_stream(0.0, [(0.0, _data({"error": {"code": 400, "message": "exceeds the available context"}}))])


def _manifest(method: str | None, bits: int | None = None, kv_cache: str = "fp32") -> Manifest:
    precision = "fp32" if method is None else "int4" if bits == 4 else "int8"
    q = None if method is None else Quantization(method=method, bits=bits)
    return Manifest(SHAPE, precision=precision, quantization=q, kv_cache=kv_cache, source=Source(path="/ckpt"))


def test_columns_are_named_from_the_manifest_and_only_weight_only_dirs_are_paired():
    cases = [(_manifest("weight-only", 8), "gptedge weight-only 8", "weight-only 8"),
             (_manifest("weight-only", 4), "gptedge weight-only 4", "weight-only 4"),
             (_manifest("dynamic", 8), "gptedge dynamic", None), (_manifest(None), "gptedge fp32", None),
             (_manifest("weight-only", 8, kv_cache="int8"), "gptedge weight-only 8 kv int8", "weight-only 8")]
    for manifest, name, pair in cases:
        column = sr.gptedge_column("/dirs/x", manifest)
        assert (column.name, column.pair, column.side) == (name, pair, "gptedge")
    assert sr.peer_column("Q8_0", "/w/model-Q8_0.gguf").pair == "weight-only 8"
    assert sr.peer_column("Q4_0", "/w/model-Q4_0.gguf").pair is None  # reported beside


def test_each_recipe_sits_beside_its_gptedge_dir_and_duplicate_names_get_the_dir():
    ours = [sr.gptedge_column(f"/d/{n}", _manifest(*m)) for n, m in
            [("wo8", ("weight-only", 8)), ("dyn", ("dynamic", 8)), ("wo4", ("weight-only", 4)),
             ("wo4b", ("weight-only", 4))]]
    peers = [sr.peer_column(r, f"/w/{r}.gguf") for r in ("Q4_K_M", "Q4_0", "Q8_0")]
    names = [c.name for c in sr.order_columns(ours, peers)]
    assert names == ["gptedge weight-only 8", "llama-server Q8_0", "gptedge dynamic", "gptedge weight-only 4 (wo4)",
                     "llama-server Q4_K_M", "gptedge weight-only 4 (wo4b)", "llama-server Q4_0"]


def _run(tok_s: dict, ttft: dict, itl: dict, rss: float, new: int = 16, tokens: list | None = None) -> dict:
    rows = [{"clients": c, "tok_s": tok_s[c], "ttft_p99": ttft.get(c, 1.0), "itl_p99": itl.get(c, 1.0),
             "tokens": tokens or [new] * c, "counted_by": ["usage"]} for c in tok_s]
    return {"rows": rows, "peak_rss_mib": rss, "size_mib": 10.0}


def _pair(gptedge_runs: list[dict], peer_runs: list[dict]) -> list:
    ours = sr.gptedge_column("/d/wo8", _manifest("weight-only", 8))
    peer = sr.peer_column("Q8_0", "/w/model-Q8_0.gguf")
    ours.runs, peer.runs = gptedge_runs, peer_runs
    return sr.order_columns([ours], [peer])


def _line(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(f"- {start}"))


def test_the_table_has_one_cell_per_column_with_every_run():
    clients = [1, 8, 16]
    g = [_run({1: 100.0, 8: 300.0, 16: 320.0}, {8: 50.0, 16: 90.0}, {1: 10.0, 8: 15.0, 16: 30.0}, 200.0),
         _run({1: 102.0, 8: 310.0, 16: 330.0}, {8: 55.0, 16: 95.0}, {1: 11.0, 8: 16.0, 16: 31.0}, 201.0)]
    p = [_run({1: 80.0, 8: 150.0, 16: 160.0}, {8: 60.0, 16: 100.0}, {1: 12.0, 8: 20.0, 16: 40.0}, 400.0)] * 2
    table = sr.build_table(_pair(g, p), clients)
    assert table[0] == "| clients | gptedge weight-only 8 | llama-server Q8_0 |"
    labels = [row.split(" | ")[0].lstrip("| ") for row in table[2:]]
    assert labels == ["1: tok/s", "8: tok/s", "16: tok/s", "8: TTFT p99 ms", "16: TTFT p99 ms",
                      "8: inter-token p99 ms", "16: inter-token p99 ms", "1: inter-token p99 ms", "peak RSS MiB",
                      "model file MiB"]
    assert table[2] == "| 1: tok/s | 100.0 / 102.0 | 80.0 / 80.0 |"
    assert "| peak RSS MiB | 200 / 201 | 400 / 400 |" in table
    # without 8 or 16 clients the latency rows are the most clients'
    assert [r.split(" | ")[0].lstrip("| ") for r in sr.build_table(_pair(g, p), [1, 2])[2:6]] == [
        "1: tok/s", "2: tok/s", "2: TTFT p99 ms", "2: inter-token p99 ms"]


def test_targets_met_and_missed_on_the_means_and_runs_that_disagree_are_flagged():
    clients = [1, 8, 16]
    # 1 client: 1.25x then 1.0x -> mean 1.125x, met on the mean but the runs disagree.
    # 8 clients: 1.2x both runs -> missed (1.5x wanted). RSS 0.5x -> met. TTFT p99 at 16 above the peer's -> missed.
    g = [_run({1: 100.0, 8: 180.0, 16: 240.0}, {8: 50.0, 16: 120.0}, {1: 10.0, 8: 15.0, 16: 30.0}, 200.0),
         _run({1: 80.0, 8: 180.0, 16: 240.0}, {8: 50.0, 16: 120.0}, {1: 10.0, 8: 25.0, 16: 30.0}, 200.0)]
    p = [_run({1: 80.0, 8: 150.0, 16: 160.0}, {8: 60.0, 16: 100.0}, {1: 12.0, 8: 20.0, 16: 40.0}, 400.0)] * 2
    lines = sr.judge(_pair(g, p), clients)
    assert lines[0] == "gptedge weight-only 8 vs llama-server Q8_0:"
    one = _line(lines, "1 client tok/s")
    assert "**met**" in one and "**runs disagree**: run 1 met, run 2 missed" in one and "1.12x" in one
    eight = _line(lines, "8 clients tok/s")
    assert "**missed**" in eight and "disagree" not in eight
    assert "**met**" in _line(lines, "16 clients tok/s")  # 240 vs 160 = 1.5x exactly
    assert "**missed**" in _line(lines, "16 clients TTFT p99") and "**met**" in _line(lines, "8 clients TTFT p99")
    assert "**met**" in _line(lines, "peak RSS") and "0.50x" in _line(lines, "peak RSS")
    own = _line(lines, "its own inter-token p99")  # 15 and 25 ms vs 10: 1.5x met, 2.5x missed, mean 2.0x met
    assert "**met**" in own and "run 1 met, run 2 missed" in own


def test_targets_without_the_client_counts_or_the_recipe_say_so():
    g = [_run({1: 100.0, 2: 150.0}, {}, {}, 200.0)]
    lines = sr.judge(_pair(g, [_run({1: 80.0, 2: 100.0}, {}, {}, 400.0)]), [1, 2])
    assert "not measured (--clients has no 8)" in _line(lines, "8 clients tok/s")
    assert "not measured" in _line(lines, "its own inter-token p99")
    ours = sr.gptedge_column("/d/wo4", _manifest("weight-only", 4))
    ours.runs = g
    dyn = sr.gptedge_column("/d/dyn", _manifest("dynamic", 8))
    dyn.runs = g
    assert sr.judge([ours, dyn], [1, 2])[0] == "gptedge weight-only 4 vs no paired recipe (--peer-recipes):"
    assert sr.judge([dyn], [1, 2]) == ["no gptedge weight-only 8- or 4-bit dir given: nothing judged"]


def test_token_notes_flag_requests_that_did_not_return_new_tokens():
    good, short = _run({1: 1.0, 2: 1.0}, {}, {}, 1.0), _run({1: 1.0, 2: 1.0}, {}, {}, 1.0, tokens=[16, 15])
    notes = sr.token_notes(_pair([good], [short]), 16)
    assert notes[0] == "- gptedge weight-only 8, run 1: 3 requests, all 16 tokens (counted by usage)"
    assert "**2 not 16**: [15]" in notes[1]


def test_the_report_holds_the_header_table_targets_and_is_written_atomically(tmp_path):
    g = [_run({1: 100.0, 8: 300.0}, {8: 50.0}, {1: 10.0, 8: 15.0}, 200.0)]
    p = [_run({1: 80.0, 8: 150.0}, {8: 60.0}, {1: 12.0, 8: 20.0}, 400.0)]
    text = sr.render_report(["- date: today"], _pair(g, p), [1, 8], 16)
    assert text.startswith("# gptedge serve vs llama-server") and "- date: today" in text
    assert "## Load (cells: run 1)" in text and "| 8: tok/s | 300.0 | 150.0 |" in text
    out = tmp_path / "deep" / "table.md"
    umask = os.umask(0o022)
    try:
        sr.write_atomic(out, text)
        sr.write_atomic(out, text + "again\n")
    finally:
        os.umask(umask)
    assert out.read_text() == text + "again\n" and [f.name for f in out.parent.iterdir()] == ["table.md"]
    assert out.stat().st_mode & 0o777 == 0o644  # the umask's mode, not mkstemp's 0600


def test_a_missing_server_binary_says_how_to_build_it(monkeypatch, tmp_path):
    monkeypatch.delenv(sp.SERVER_ENV, raising=False)
    with pytest.raises(SystemExit, match=r"cmake -S SDIST/vendor/llama.cpp .* --target llama-server"):
        sp.llama_server_binary()
    monkeypatch.setenv(sp.SERVER_ENV, str(tmp_path / "nowhere"))
    with pytest.raises(SystemExit, match="is not an executable file"):
        sp.llama_server_binary()


def test_the_checkpoint_work_dir_follows_its_files_and_other_weights_are_refused(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights")
    digest = sp.sha256_file(ckpt / "model.safetensors")
    fp32 = Source(path=str(ckpt), weights="model.safetensors", sha256=digest)
    quantized = Manifest(SHAPE, precision="int8", quantization=Quantization(method="dynamic"),
                         source=Source(quantized_from="/d/fp32", fp32_source=fp32))
    work = sp.checkpoint_work(ckpt, {"/d/dyn": quantized}, tmp_path / "work")
    assert work.parent == tmp_path / "work" and work.name.startswith("ckpt-")
    (ckpt / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(SystemExit, match="is not the file /d/dyn was exported from"):
        sp.checkpoint_work(ckpt, {"/d/dyn": quantized}, tmp_path / "work")
    assert sp.checkpoint_work(ckpt, {}, tmp_path / "work") != work  # rewritten: converted afresh


def test_existing_ggufs_are_reused_without_llama_cpp(tmp_path):
    for name in ("model-f32.gguf", "model-Q8_0.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert sp.peer_gguf(tmp_path / "ckpt", "Q8_0", tmp_path, 2) == tmp_path / "model-Q8_0.gguf"
    assert sp.peer_gguf(tmp_path / "ckpt", "F32", tmp_path, 2) == tmp_path / "model-f32.gguf"


def test_llama_server_gets_the_issues_command_line():
    class Args:
        threads, max_batch, peer_args = 2, 16, ["--cache-ram", "0"]
    assert sp.llama_server_command("/b/llama-server", "/w/m.gguf", Args, 1024, 8080) == [
        "/b/llama-server", "-m", "/w/m.gguf", "-t", "2", "-tb", "2", "-np", "16", "-c", "16384",
        "--host", "127.0.0.1", "--port", "8080", "--cache-ram", "0"]


def test_serve_args_reach_the_gptedge_server_command(monkeypatch, tmp_path):
    """--serve-args='--spin' (an A/B of a serve option) is appended to `gptedge serve`'s command line."""
    seen, envs = [], []

    class Proc:
        pid = 1

        def poll(self):
            return None

    def popen(cmd, stdout, stderr, env=None):
        seen.append(cmd)
        envs.append(env)
        stderr.write(b"gptedge serve: listening on http://127.0.0.1:5123\n")
        stderr.flush()
        return Proc()

    monkeypatch.setattr(sl.subprocess, "Popen", popen)
    _, url = sl.start_server(tmp_path / "m", 2, 16, tmp_path / "serve.log", ["--spin", "--prefill-budget", "64"])
    assert url == "http://127.0.0.1:5123"
    assert seen[0][1:3] == ["-m", "gptedge.cli"] and envs[0] is None
    assert seen[0][3:] == ["serve", str(tmp_path / "m"), "--port", "0", "--model-name", "bench", "--threads", "2",
                           "--max-batch", "16", "--max-queue", "256", "--spin", "--prefill-budget", "64"]
    sl.start_server(tmp_path / "m", 2, 16, tmp_path / "serve.log", [], trace=str(tmp_path / "trace"))  # --trace
    assert seen[1][1].endswith("engine_trace.py") and seen[1][2:4] == ["serve", str(tmp_path / "m")]
    assert envs[1]["GPTEDGE_ENGINE_TRACE"] == str(tmp_path / "trace")


def test_gptedge_runs_without_prefix_reuse_beside_llama_server_unless_asked():
    """llama-server's requests carry cache_prompt: false, and the load repeats its prompts: gptedge's reuse (on by
    default) is turned off for a --peer run, unless --serve-args names it."""
    assert sl.serve_args_beside_llama_server([]) == ["--prefix-cache-mb", "0"]
    assert sl.serve_args_beside_llama_server(["--spin"]) == ["--spin", "--prefix-cache-mb", "0"]
    assert sl.serve_args_beside_llama_server(["--prefix-cache-mb", "64"]) == ["--prefix-cache-mb", "64"]
    assert sl.serve_args_beside_llama_server(["--prefix-cache-mb=64"]) == ["--prefix-cache-mb=64"]
    assert any("--prefix-cache-mb 0" in note for note in sr.NOTES)


def test_the_json_carries_the_machine_facts_beside_every_figure():
    g = [_run({1: 100.0, 8: 300.0}, {8: 50.0}, {1: 10.0, 8: 15.0}, 200.0)]
    p = [_run({1: 80.0, 8: 150.0}, {8: 60.0}, {1: 12.0, 8: 20.0}, 400.0)]
    facts = ["- date: today", "- CPU: Some CPU; 2 logical CPUs; ISA: avx2 yes, avx512f no"]
    data = json.loads(sr.report_json(facts, _pair(g, p)))
    assert data["facts"] == ["date: today", "CPU: Some CPU; 2 logical CPUs; ISA: avx2 yes, avx512f no"]
    assert [c["side"] for c in data["columns"]] == ["gptedge", "llama-server"]
    assert data["columns"][0]["runs"][0]["rows"][1]["tok_s"] == 300.0


def test_device_reaches_generate_and_the_server(monkeypatch, gpt2_kv_buffer_loaded):
    """--device cuda: the in-process generate loads on that device and `gptedge serve` gets --device cuda."""
    import argparse

    import gptedge.runtime

    devices, extras = [], []

    class Loaded:
        def generate(self, *a, **k):
            return argparse.Namespace(tokens_per_s=1.0)

    def load(model, device, session):
        devices.append(device)
        return Loaded()

    def start_server(model, threads, max_batch, log, extra, trace=None):
        extras.append(list(extra))
        raise SystemExit("stop here")

    monkeypatch.setattr(gptedge.runtime, "load", load)
    monkeypatch.setattr(sl, "start_server", start_server)
    args = argparse.Namespace(device="cuda", threads=2, max_batch=4, serve_args=["--spin"], new=4, prompt=8, requests=1,
                              clients=[1])
    with pytest.raises(SystemExit, match="stop here"):
        sl.bench_model(gpt2_kv_buffer_loaded.model_dir, args)
    assert devices == ["cuda"] and extras == [["--spin", "--device", "cuda"]]


def test_the_engine_trace_sums_turns_by_kind_and_times_each_burst_until_the_batch_is_full_again():
    """benchmarks/engine_trace.py's summary over a made-up trace: two rows stepping plain, a prefill of two
    newcomers, then four rows stepped ahead; a burst of two submissions 1 ms apart, then a lone one."""
    et = importlib.import_module("engine_trace")  # beside serve_load, on the path it put there
    rows = [["su", 0.000, 0, 1, 0], ["su", 0.001, 0, 1, 0],
            ["pr", 0.002, 0.006, 2, 2], ["de", 0.006, 0.009, [2, False], 2],
            ["pr", 0.009, 0.010, 2, 4], ["de", 0.010, 0.012, [4, True], 4], ["de", 0.012, 0.014, [4, True], 4],
            ["pr", 0.014, 0.0141, 0, 4],  # nothing waiting: not a prefill
            ["su", 0.500, 0, 1, 0]]
    lines = et.summary(rows)
    assert "3 submissions" in lines[0] and "span 12 ms" in lines[0]
    kinds = {line.split(" n=")[0].strip(): line for line in lines[1:] if " n=" in line}
    assert set(kinds) == {"decode turn, 1-15 rows, plain", "decode turn, full rows, stepped ahead", "prefill turn"}
    assert "n=    2  total      5.0 ms  mean   2.50 ms" in kinds["prefill turn"]
    assert "n=    2  total      4.0 ms" in kinds["decode turn, full rows, stepped ahead"]
    bursts = [line for line in lines if "burst" in line]
    assert bursts == ["  burst of   2 submissions over    1.0 ms; 4 rows stepping 10.0 ms after its first"]
