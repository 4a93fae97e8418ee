"""One pipeline of model-dir checks that load, verify, pack and serve run: each broken case below fails in one
line naming both values (pack refuses to ship it, verify does not say "verified"). Cases copy a dir a session
fixture built, break one thing, and run the command."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from gptedge.runtime import load, load_classifier
from gptedge.runtime.checks.pipeline import check_dir, check_model_dir
from gptedge.runtime.errors import GptEdgeError, ModelDirError
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest, write_manifest
from gptedge.runtime.verify import FAIL, WARN, verify_model_dir

from ..support.checkpoints import tiny_reference, write_checkpoint
from ..support.cli import run_gptedge

pytestmark = pytest.mark.slow  # verify / pack / serve through the real command, several exports and packs


def copy(src: Path, tmp_path: Path, name: str = "d") -> Path:
    out = tmp_path / name
    shutil.copytree(src, out)
    return out


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def fails(d: Path) -> list[str]:
    return [f.line for f in verify_model_dir(d, device="cpu") if f.status == FAIL]


def flip_weight_byte(d: Path) -> None:
    raw = bytearray((d / "model.onnx").read_bytes())
    raw[-5000] ^= 0x40
    (d / "model.onnx").write_bytes(bytes(raw))


@pytest.fixture(scope="module")
def other_checkpoint_dir(tmp_path_factory, gpt2_checkpoint) -> Path:
    """The tiny GPT-2's shape and tokenizer with other weights (another checkpoint), quantized dynamic (q8)."""
    from gptedge.export.exporter import export_checkpoint
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    root = tmp_path_factory.mktemp("other-ck")
    ck = write_checkpoint(tiny_reference("gpt2", seed=9), root / "ck")
    export_checkpoint(ck, root / "fp32", validate=False)
    quantize_model_dir(root / "fp32", root / "q8", QuantizeRecipe("dynamic"))
    return root / "q8"


# -- load --------------------------------------------------------------------------------------------------------

def test_a_format_2_manifest_without_files_is_refused_at_load(gpt2_model_dir, tmp_path):
    d = copy(gpt2_model_dir, tmp_path)
    flip_weight_byte(d)
    edit_json(d / MANIFEST_NAME, lambda m: m.pop("files"))
    with pytest.raises(ModelDirError) as caught:
        load(d, device="cpu")
    line = str(caught.value)
    assert "format_version 2) has no `files` list" in line and "\n" not in line, line
    assert any("has no `files` list" in f for f in fails(d))


# -- pack: the six silent-wrong cases ----------------------------------------------------------------------

def _fp32_claim_over_int8(d: Path, sample_recipe_dirs) -> None:
    """The dynamic-INT8 graph under an fp32 manifest, its records re-written so that only the claim can tell."""
    shutil.copyfile(sample_recipe_dirs["dynamic"] / "model.onnx", d / "model.onnx")
    write_manifest(d, read_manifest(d))


PACK_CASES = [  # (id, target, breakage, what the one line says)
    ("flipped-weight-byte-web", "web", lambda d, dirs: flip_weight_byte(d), "model.onnx: its SHA-256 is"),
    ("flipped-weight-byte-mobile", "mobile", lambda d, dirs: flip_weight_byte(d), "model.onnx: its SHA-256 is"),
    ("fp32-manifest-over-int8-graph", "web", _fp32_claim_over_int8,
     "gptedge.json says the model is not quantized (fp32), the graph is dynamic-quantized"),
    ("model_file-dotdot", "web", lambda d, dirs: edit_json(d / MANIFEST_NAME,
                                                           lambda m: m.update(model_file="../../other/model.onnx")),
     "model_file '../../other/model.onnx' is not a plain path inside the model directory"),
    ("model_file-absolute", "mobile",
     lambda d, dirs: edit_json(d / MANIFEST_NAME, lambda m: m.update(model_file=str(dirs["dynamic"] / "model.onnx"))),
     "is not a plain path inside the model directory"),
    ("config-not-json", "web", lambda d, dirs: (d / "config.json").write_text("{not json"),
     "config.json cannot be read"),
]


@pytest.mark.parametrize("case, target, breakage, says", PACK_CASES, ids=[c[0] for c in PACK_CASES])
def test_pack_refuses_a_dir_that_fails_the_pipeline(sample_recipe_dirs, tmp_path, case, target, breakage, says):
    d = copy(sample_recipe_dirs["fp32"], tmp_path)
    assert check_model_dir(d).precision == "fp32"  # as exported, it passes
    breakage(d, sample_recipe_dirs)
    out = tmp_path / "out"
    done = run_gptedge("pack", str(d), "--target", target, "-o", str(out), *(["--no-page"] if target == "web" else []))
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith("Error: ") and says in done.stderr and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr
    assert not out.exists()


def test_pack_refuses_two_checkpoints_in_one_site(gpt2_model_dir, other_checkpoint_dir, tmp_path):
    from gptedge.pack.web import WebPackError, checkpoint_sha256, write_web_model

    ours = checkpoint_sha256(read_manifest(gpt2_model_dir).source)
    theirs = checkpoint_sha256(read_manifest(other_checkpoint_dir).source)
    assert ours and theirs and ours != theirs
    with pytest.raises(WebPackError) as caught:
        write_web_model([gpt2_model_dir, other_checkpoint_dir], tmp_path)
    line = str(caught.value)
    assert "come from different checkpoints" in line and ours[:16] in line and theirs[:16] in line
    assert str(gpt2_model_dir) in line and str(other_checkpoint_dir) in line and "\n" not in line
    assert not any(tmp_path.iterdir())


def test_pack_of_an_ort_format_dir_is_one_line(sample_recipe_dirs, tmp_path):
    mobile = tmp_path / "ort"
    assert run_gptedge("pack", str(sample_recipe_dirs["dynamic"]), "--target", "mobile", "-o",
                       str(mobile)).returncode == 0
    for target, says in (("web", "is in the ORT format"), ("mobile", "is already in the ORT format")):
        done = run_gptedge("pack", str(mobile), "--target", target, "-o", str(tmp_path / target),
                       *(["--no-page"] if target == "web" else []))
        assert done.returncode == 1 and says in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


# -- verify: the ten silent-wrong cases --------------------------------------------------------------------

def _labels_swapped(d: Path) -> None:
    edit_json(d / MANIFEST_NAME, lambda m: m["task"]["id2label"].update({"0": m["task"]["id2label"]["1"],
                                                                        "1": m["task"]["id2label"]["0"]}))


CLASSIFIER_CASES = [  # (id, breakage, what verify's FAIL line says)
    ("labels-swapped-vs-config-id2label", _labels_swapped,
     "gptedge.json says the labels are ['neutral', 'contradiction', 'entailment'], config.json's id2label says "
     "['contradiction', 'neutral', 'entailment']"),
    ("extract-token-made-ordinary", lambda d: edit_json(d / MANIFEST_NAME,
                                                        lambda m: m["task"]["special_tokens"].update(extract=464)),
     "gptedge.json says the extract token is 464, which is 'The' in tokenizer.json; tokenizer_config.json declares "
     "'<extract>' (cls_token) = 50259"),
    ("template-lost-its-extract-step", lambda d: edit_json(d / MANIFEST_NAME, lambda m: m["task"]["transformation"]
                                                           .update(sequences=[["start", "premise", "delimiter",
                                                                               "hypothesis"]])),
     "gptedge.json says task entailment with the template start premise delimiter hypothesis (one), which is neither "
     "entailment's"),
    ("task-renamed", lambda d: edit_json(d / MANIFEST_NAME, lambda m: m["task"].update(name="sentiment")),
     "gptedge.json says task 'sentiment', which is not one of classification, entailment, similarity, "
     "multiple-choice"),
]


@pytest.mark.parametrize("case, breakage, says", CLASSIFIER_CASES, ids=[c[0] for c in CLASSIFIER_CASES])
def test_verify_catches_a_classifier_that_is_not_what_it_says(task_dirs, tmp_path, case, breakage, says):
    d = copy(task_dirs["gpt2-seq"], tmp_path)
    assert fails(d) == []
    breakage(d)
    found = fails(d)
    assert any(says in line for line in found), found
    with pytest.raises(GptEdgeError):  # load refuses what verify now lists
        load_classifier(d, device="cpu")


FILE_CASES = [  # (id, dir kind, breakage, says)
    ("genai-eos-edited", "fp32", lambda d: edit_json(d / "genai_config.json",
                                                     lambda g: g["model"].update(eos_token_id=7)),
     "gptedge.json says eos_id 0, genai_config.json says model.eos_token_id 7"),
    ("genai-context-edited", "fp32", lambda d: edit_json(d / "genai_config.json",
                                                         lambda g: g["model"].update(context_length=4096)),
     "gptedge.json says context_length 256, genai_config.json says model.context_length 4096"),
    ("tokenizer_config-model_max_length-edited", "fp32",
     lambda d: edit_json(d / "tokenizer_config.json", lambda t: t.update(model_max_length=1024)),
     "gptedge.json says context_length 256, tokenizer_config.json says model_max_length 1024"),
    ("per_channel-contradicted", "dynamic",
     lambda d: edit_json(d / MANIFEST_NAME, lambda m: m["quantization"].update(per_channel=False)),
     "gptedge.json says per_channel false, the graph's"),
    ("reduce_range-contradicted", "dynamic",
     lambda d: edit_json(d / MANIFEST_NAME, lambda m: m["quantization"].update(reduce_range=False)),
     "gptedge.json says reduce_range false, the graph's"),
    ("accuracy_level-contradicted", "w4",
     lambda d: edit_json(d / MANIFEST_NAME, lambda m: m["quantization"].update(accuracy_level=0)),
     "gptedge.json says accuracy_level 0, the graph's MatMulNBits compute at accuracy level 4"),
]


@pytest.mark.parametrize("case, kind, breakage, says", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_verify_catches_claims_other_engines_and_the_graph_contradict(sample_recipe_dirs, tmp_path, case, kind,
                                                                     breakage, says):
    d = copy(sample_recipe_dirs[kind], tmp_path)
    assert fails(d) == []
    breakage(d)
    found = fails(d)
    assert any(says in line for line in found), found
    with pytest.raises(ModelDirError, match=re.escape(says)):  # pack / serve raise the first
        check_model_dir(d)


def test_verify_checks_a_mobile_packs_claims_and_says_what_it_cannot(sample_recipe_dirs, tmp_path):
    from gptedge.pack.mobile import write_mobile_model

    pack = tmp_path / "mobile"
    pack.mkdir()
    write_mobile_model(sample_recipe_dirs["dynamic"], pack)
    findings = verify_model_dir(pack, device="cpu")
    assert [f.line for f in findings if f.status == FAIL] == []
    assert any(f.status == WARN and "ORT-format graph" in f.line and "per_channel" in f.line for f in findings)
    edit_json(pack / MANIFEST_NAME, lambda m: (m.update(precision="fp32"), m.pop("quantization")))
    found = fails(pack)
    assert ("gptedge.json says the model is not quantized (fp32), the graph is dynamic-quantized (it holds "
            "MatMulIntegerToFloat)") in found, found
    with pytest.raises(ModelDirError, match="the graph is dynamic-quantized"):
        load(pack, device="cpu")


def test_the_pipeline_lists_every_problem_and_check_model_dir_raises_the_first(sample_recipe_dirs, tmp_path):
    d = copy(sample_recipe_dirs["fp32"], tmp_path)
    edit_json(d / "genai_config.json", lambda g: g["model"].update(eos_token_id=7, context_length=4096))
    edit_json(d / "tokenizer_config.json", lambda t: t.update(model_max_length=1024))
    found = check_dir(d)
    assert [check for check, _ in found.problems] == ["claims"] * 3
    with pytest.raises(ModelDirError) as caught:
        check_model_dir(d)
    assert str(caught.value) == f"{d}: {found.problems[0][1]} (and 2 more: gptedge verify {d} lists them)"
