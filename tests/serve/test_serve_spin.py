"""`gptedge serve --spin-us N`: ONNX Runtime's threads spin at most N microseconds before they sleep, as
`SessionConfig(spin_us=N)` asks the session (session.intra_op.spin_duration_us); it implies --spin."""

from __future__ import annotations

import pytest

from gptedge.cli import main
from gptedge.runtime import SessionConfig, load
from gptedge.runtime.errors import InvalidArgumentError


def test_a_spin_bound_reaches_onnx_runtime(gpt2_kv_buffer_loaded):
    model = load(gpt2_kv_buffer_loaded.model_dir, device="cpu", session=SessionConfig(threads=1, spin=True,
                                                                                      spin_us=150))
    options = model.session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "1"
    assert options.get_session_config_entry("session.intra_op.spin_duration_us") == "150"


@pytest.mark.parametrize("bad", [0, -5, 100_001, 1.5, True, "100"])
def test_a_spin_bound_outside_its_range_is_refused(bad):
    with pytest.raises(InvalidArgumentError, match="spin_us must be an integer"):
        SessionConfig(spin_us=bad)


class _Loaded(Exception):
    """Raised by the stand-in load: the command got as far as loading the model."""


@pytest.mark.parametrize(("args", "spin", "spin_us"), [(["--spin-us", "200"], True, 200),
                                                       (["--no-spin", "--spin-us", "50"], True, 50),
                                                       (["--spin"], True, None), ([], False, None)])
def test_serve_passes_the_spin_bound_to_the_session(runner, monkeypatch, gpt2_model_dir, args, spin, spin_us):
    import gptedge.cli.serve as serve_cli

    seen = []

    def load_stub(model, device, session):
        seen.append(session)
        raise _Loaded()

    monkeypatch.setattr(serve_cli.runtime, "load", load_stub)
    result = runner.invoke(main, ["serve", str(gpt2_model_dir), "--port", "0", *args])
    assert seen and "_Loaded" in result.output, result.output  # the command reached the load, and stopped there
    assert (seen[0].spin, seen[0].spin_us) == (spin, spin_us)


def test_serve_refuses_a_spin_bound_out_of_range(runner, gpt2_model_dir):
    result = runner.invoke(main, ["serve", str(gpt2_model_dir), "--spin-us", "0"])
    assert result.exit_code == 2 and "--spin-us" in result.output
