"""`gptedge serve --spin-us N`: ONNX Runtime's threads spin at most N microseconds before they sleep, as
`SessionConfig(spin_us=N)` asks the session (session.intra_op.spin_duration_us); it implies spinning.
`--spin-in-runs` (the default): they spin inside a run only (`SessionConfig(spin_between_runs=False)`, ONNX Runtime's
session.force_spinning_stop), at most RUN_SPIN_US at a time unless --spin-us says; `--spin` spins between runs too
(ORT's own spin), `--no-spin` never."""

from __future__ import annotations

import pytest

from gptedge.cli import main
from gptedge.cli.serve import RUN_SPIN_US
from gptedge.runtime import SessionConfig, load
from gptedge.runtime.errors import InvalidArgumentError


def test_a_spin_bound_reaches_onnx_runtime(gpt2_kv_buffer_loaded):
    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu", session=SessionConfig(threads=1, spin=True,
                                                                                      spin_us=150))
    options = model.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.intra_op.spin_duration_us") == "150"


@pytest.mark.parametrize(("between", "entry"), [(False, "1"), (True, None)])
def test_spinning_inside_runs_only_reaches_onnx_runtime(gpt2_kv_buffer_loaded, between, entry):
    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu", session=SessionConfig(threads=2, spin=True,
                                                                                      spin_between_runs=between))
    options = model.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert _entry(options, "session.force_spinning_stop") == entry


def _entry(options, key: str) -> str | None:
    try:
        return options.get_session_config_entry(key)
    except Exception:  # ONNX Runtime raises its own Fail for a key never set
        return None


def test_spinning_inside_runs_only_keeps_the_engines_greedy_tokens(gpt2_kv_buffer_loaded):
    """Scheduling, not arithmetic: one request alone, then two decoding together, get generate's greedy tokens."""
    from gptedge.runtime.generation.sampling import SamplingParams
    from gptedge.runtime.serving.engine import CompletionRequest, Engine

    from ..support.engine import Collector

    reference = gpt2_kv_buffer_loaded
    model = load(reference.model_dir, device="cpu", session=SessionConfig(threads=2, spin=True,
                                                                          spin_between_runs=False))
    prompts = [tuple(reference.encode(t)) for t in ("Hello there", "The quick brown", "Once")]
    engine = Engine(model, max_batch=4).start()
    try:
        for group in (prompts[:1], prompts[1:]):  # a lone row, then two rows in one batch
            got = [Collector() for _ in group]
            for ids, collector in zip(group, got, strict=True):
                engine.submit(CompletionRequest(ids, 6, SamplingParams(greedy=True), ignore_eos=True), collector)
            for ids, collector in zip(group, got, strict=True):
                assert collector.finished()
                assert collector.last.generation.ids == reference.generate(list(ids), 6, greedy=True,
                                                                           ignore_eos=True).ids
    finally:
        engine.stop(grace_s=1)


@pytest.mark.parametrize("bad", [0, -5, 100_001, 1.5, True, "100"])
def test_a_spin_bound_outside_its_range_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="spin_us must be an integer"):
        SessionConfig(spin_us=bad)


class _Loaded(Exception):
    """Raised by the stand-in load: the command got as far as loading the model."""


@pytest.mark.parametrize(("args", "spin", "spin_us", "between"), [
    (["--spin-us", "200"], True, 200, False), (["--no-spin", "--spin-us", "50"], True, 50, True),
    (["--spin"], True, None, True), (["--no-spin"], False, None, True), ([], True, RUN_SPIN_US, False),
    (["--spin-in-runs"], True, RUN_SPIN_US, False), (["--spin", "--spin-in-runs"], True, RUN_SPIN_US, False),
    (["--spin-in-runs", "--spin-us", "300"], True, 300, False)])
def test_serve_passes_the_spin_setting_to_the_session(runner, monkeypatch, gpt2_model_dir, args, spin, spin_us,
                                                      between):
    import gptedge.cli.serve as serve_cli

    seen = []

    def load_stub(model, device, session):
        seen.append(session)
        raise _Loaded()

    monkeypatch.setattr(serve_cli.runtime, "load", load_stub)
    result = runner.invoke(main, ["serve", str(gpt2_model_dir), "--port", "0", *args])
    assert seen and "_Loaded" in result.output, result.output  # the command reached the load, and stopped there
    assert (seen[0].spin, seen[0].spin_us, seen[0].spin_between_runs) == (spin, spin_us, between)


def test_serve_refuses_a_spin_bound_out_of_range(runner, gpt2_model_dir):
    result = runner.invoke(main, ["serve", str(gpt2_model_dir), "--spin-us", "0"])
    assert result.exit_code == 2 and "--spin-us" in result.output
