"""Rungs 1-2: the reference GPT against transformers, and its KV cache against full recompute."""

from __future__ import annotations

import pytest
import torch

from gptedge.export.checkpoint import load_checkpoint, load_state
from gptedge.export.families import family, hf_config, read_hf_config
from gptedge.export.reference import reference_positions
from gptedge.runtime.generation.generation import positions

from ..support.checkpoints import tiny_reference

transformers = pytest.importorskip("transformers")

TOL = 1e-5


def hf_model(arch: str, reference):
    """A transformers model holding the reference's weights (through the family's weight-name table)."""
    if arch == "gpt2":
        cls, cfg = transformers.GPT2LMHeadModel, transformers.GPT2Config(**hf_config(reference.cfg))
    else:
        cls, cfg = transformers.OpenAIGPTLMHeadModel, transformers.OpenAIGPTConfig(**hf_config(reference.cfg))
    model = cls(cfg).eval()
    state = {family(arch).hf_name(k): v for k, v in reference.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model


@pytest.mark.parametrize("arch", ["gpt2", "openai-gpt"])
def test_rung1_reference_matches_transformers(arch):
    ref = tiny_reference(arch, seed=3)
    hf = hf_model(arch, ref)
    ids = torch.randint(0, ref.cfg.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = hf(ids).logits
        got, _ = ref(ids)
    diff = (want - got).abs().max().item()
    assert diff <= TOL, f"{arch}: max |diff| {diff:.2e}"


def test_rung1_left_padded_batch_matches_transformers():
    ref = tiny_reference("gpt2", seed=4)
    hf = hf_model("gpt2", ref)
    ids = torch.randint(0, ref.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :4] = 0
    pos = torch.from_numpy(positions(mask.numpy()))
    with torch.no_grad():
        want = hf(ids, attention_mask=mask, position_ids=pos).logits
        got, _ = ref(ids, mask, pos)
    valid = mask.bool()
    assert (want[valid] - got[valid]).abs().max().item() <= TOL


def test_reference_positions_are_the_runtimes():
    """The oracle's own position rule equals the runtime's (generation.positions) on left-padded rows."""
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0]])
    got = reference_positions(mask)
    assert got.dtype == torch.long
    assert got.tolist() == positions(mask.numpy()).tolist() == [[0, 0, 0, 0, 1, 2], [0, 1, 2, 3, 4, 5],
                                                                [0, 0, 0, 1, 2, 2]]


def test_left_padding_leaves_the_valid_positions_unchanged():
    """The reference's default position ids: a left-padded row gives the logits of the same row unpadded."""
    ref = tiny_reference("gpt2", seed=4)
    ids = torch.randint(0, ref.cfg.vocab_size, (1, 6), generator=torch.Generator().manual_seed(5))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        want, _ = ref(ids)
        got, _ = ref(padded, mask)
    assert (want[0] - got[0, 3:]).abs().max().item() <= TOL


@pytest.mark.parametrize("arch", ["gpt2", "openai-gpt"])
def test_weight_names_are_transformers_keys_both_ways(arch):
    """The family's one name table: reference name -> transformers' key -> the same reference name."""
    ref = tiny_reference(arch)
    hf_keys = set(hf_model(arch, ref).state_dict())
    fam = family(arch)
    for name in ref.state_dict():
        assert fam.hf_name(name) in hf_keys, name
        assert fam.our_name(fam.hf_name(name)) == name
        assert fam.our_name(fam.hf_name(name)[len("transformer."):]) == name  # base-model checkpoints: no prefix


@pytest.mark.parametrize("arch", ["gpt2", "openai-gpt"])
def test_config_json_round_trips_through_the_family(arch):

    cfg = tiny_reference(arch, n_inner=48 if arch == "gpt2" else None).cfg
    assert read_hf_config(hf_config(cfg)) == cfg


def test_unknown_family_and_unsupported_fields_are_named():
    from gptedge.export.config import GPTConfig
    from gptedge.runtime.errors import CheckpointError

    with pytest.raises(CheckpointError, match="model_type 'mamba' is not supported"):
        read_hf_config({"model_type": "mamba"})
    with pytest.raises(CheckpointError, match="arch 'mamba'"):
        GPTConfig(arch="mamba")
    with pytest.raises(CheckpointError, match="scale_attn_by_inverse_layer_idx=True"):
        read_hf_config({"model_type": "gpt2", "scale_attn_by_inverse_layer_idx": True})
    with pytest.raises(CheckpointError, match="no exact-erf GELU"):
        hf_config(GPTConfig(arch="openai-gpt", activation="gelu_erf"))


@pytest.mark.parametrize("arch", ["gpt2", "openai-gpt"])
def test_rung2_kv_cache_matches_recompute(arch):
    ref = tiny_reference(arch, seed=5)
    ids = torch.randint(0, ref.cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full, _ = ref(ids)
        logits, past = ref(ids[:, :7])
        steps = [logits]
        for t in range(7, 12):
            mask = torch.ones(2, t + 1, dtype=torch.long)
            logits, past = ref(ids[:, t:t + 1], mask, torch.full((2, 1), t), past)
            steps.append(logits)
    cached = torch.cat(steps, dim=1)
    assert (full - cached).abs().max().item() <= TOL


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_checkpoints_load_as_fp32(tmp_path, dtype):
    from gptedge.export.checkpoint import save_checkpoint

    ref = tiny_reference("gpt2", seed=6)
    save_checkpoint(ref, tmp_path, dtype=dtype)
    loaded, _ = load_checkpoint(tmp_path)
    for name, p in loaded.state_dict().items():
        assert p.dtype == torch.float32
        assert torch.equal(p, ref.state_dict()[name].to(dtype).float()), name


def test_pytorch_model_bin_loads(tmp_path):
    ref = tiny_reference("openai-gpt", seed=7)
    (tmp_path / "config.json").write_text(__import__("json").dumps(hf_config(ref.cfg)))
    torch.save({family("openai-gpt").hf_name(k): v for k, v in ref.state_dict().items()},
               tmp_path / "pytorch_model.bin")
    loaded, cfg = load_checkpoint(tmp_path)
    assert cfg == ref.cfg
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in ref.state_dict().items())


def test_state_errors_name_the_tensor():
    from gptedge.runtime.errors import CheckpointError

    ref = tiny_reference("gpt2")
    state = {"transformer." + k: v for k, v in ref.state_dict().items()}
    broken = dict(state)
    del broken["transformer.h.1.mlp.c_fc.bias"]
    with pytest.raises(CheckpointError, match=r"missing tensor 'h\.1\.mlp\.c_fc\.bias'"):
        load_state(ref.cfg, broken, "x")
    with pytest.raises(CheckpointError, match="unexpected tensor 'transformer.h.0.attn.rotary'"):
        load_state(ref.cfg, {**state, "transformer.h.0.attn.rotary": torch.zeros(1)}, "x")
    bad = {**state, "transformer.wpe.weight": torch.zeros(5, 32)}
    with pytest.raises(CheckpointError, match=r"'transformer.wpe.weight' has shape \[5, 32\], expected \[128, 32\]"):
        load_state(ref.cfg, bad, "x")
    with pytest.raises(CheckpointError, match="untied"):
        load_state(ref.cfg, {**state, "lm_head.weight": torch.zeros_like(state["transformer.wte.weight"])}, "x")
