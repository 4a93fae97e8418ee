"""Optimum's dynamic INT8 of an HF checkpoint, as a directory gptedge's runtime (and compare) can load.

ORTModelForCausalLM exports the checkpoint; ORTQuantizer applies its avx512_vnni dynamic,
per-channel recipe (what Optimum users get). The quantized graph is saved as model.onnx with
the checkpoint's tokenizer.json, so `gptedge compare` can put it in the same table.

    python benchmarks/optimum_int8.py samples/sample-model -o out/optimum-int8
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from optimum.onnxruntime import ORTModelForCausalLM, ORTQuantizer
from optimum.onnxruntime.configuration import AutoQuantizationConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("-o", "--out", type=Path, required=True)
    ap.add_argument("--tokenizer", type=Path, help="tokenizer.json to copy (default: the checkpoint's)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32"
        ORTModelForCausalLM.from_pretrained(args.checkpoint, export=True).save_pretrained(fp32)
        q = Path(tmp) / "int8"
        ORTQuantizer.from_pretrained(fp32).quantize(
            save_dir=q, quantization_config=AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=True))
        if args.out.exists():
            shutil.rmtree(args.out)
        args.out.mkdir(parents=True)
        shutil.copyfile(next(q.glob("*.onnx")), args.out / "model.onnx")
        for name in ("config.json", "generation_config.json"):
            if (fp32 / name).exists():
                shutil.copyfile(fp32 / name, args.out / name)
        shutil.copyfile(args.tokenizer or args.checkpoint / "tokenizer.json", args.out / "tokenizer.json")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
