"""`gptedge pack MODEL... --target web|mobile -o OUT`: model dirs made ready for a browser or a phone (gptedge.pack).

OUT is written atomically (built beside it, renamed into place) and replaced only with --force, as every gptedge
output; onnx (the quantize extra) is imported when the command runs.
"""

from __future__ import annotations

from pathlib import Path

import click

from gptedge.atomic import atomic_output_dir, check_output
from gptedge.pack.js_deps import node_modules
from gptedge.pack.page import PLAYGROUND, write_page

from .group import command
from .options import FORCE_HELP, diag, import_extra


@command()
@click.argument("models", nargs=-1, required=True, type=click.Path(file_okay=False, path_type=str))
@click.option("--target", required=True, type=click.Choice(["web", "mobile"]),
              help="web: transformers.js' layout (onnxruntime-web) + the playground page; mobile: the ORT format.")
@click.option("-o", "--out", required=True, type=click.Path(path_type=str), help="Folder to write.")
@click.option("--force", is_flag=True, help=FORCE_HELP)
@click.option("--page/--no-page", default=True, show_default=True,
              help="web: also write the playground page and its JavaScript into OUT/playground/.")
@click.option("--platform", type=click.Choice(["arm", "amd64"]), default="arm", show_default=True,
              help="mobile: the CPU the ORT model is optimized for (arm: phones).")
def pack(models: tuple[str, ...], target: str, out: str, force: bool, page: bool, platform: str) -> None:
    """Pack MODEL dirs for a web browser or a phone.

    web: one folder transformers.js loads (`onnx/model*.onnx` under its dtype names: fp32, q8 = dynamic INT8,
    int8 = weight-only 8-bit, uint8 = static INT8, q4 = 4-bit), several MODEL dirs of one model side by side; open
    OUT/playground/ from any static server, or `gptedge serve`. mobile: one MODEL as model.ort plus the
    required-operators config for a minimal ONNX Runtime build."""
    ctx = click.get_current_context()
    given = {name for name in ("page", "platform")
             if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT}
    if target == "web" and "platform" in given:
        raise click.UsageError("--platform applies to --target mobile (the CPU the ORT model is optimized for), "
                               "not --target web")
    if target == "mobile" and "page" in given:
        raise click.UsageError("--page / --no-page apply to --target web (the playground page), not --target mobile")
    check_output(out, force, inputs=models)
    if target == "mobile" and len(models) != 1:
        raise click.UsageError("--target mobile packs one MODEL dir")
    if target == "web" and page:
        node_modules()  # refuse before any work when the page's JavaScript is not installed
    if target == "mobile":
        mobile = import_extra("gptedge.pack.mobile", "quantize")
        with atomic_output_dir(out, force, inputs=models) as tmp:
            result = mobile.write_mobile_model(Path(models[0]), tmp, platform)
        diag(f"packed {models[0]} -> {out}/{result['model']} ({result['bytes'] / 1e6:.1f} MB, {platform}; "
             f"{len(result['operators'])} operators in {result['operators_config']})")
        return
    web = import_extra("gptedge.pack.web", "quantize")
    with atomic_output_dir(out, force, inputs=models) as tmp:
        result = web.write_web_model([Path(m) for m in models], tmp)
        vendored = write_page(tmp / PLAYGROUND, "../") if page else 0
    for m in result["models"]:
        diag(f"{m['file']}: {m['dtype']} <- {m['source']} ({m['recipe']}, {m['bytes'] / 1e6:.1f} MB)")
    where = f"; playground in {out}/{PLAYGROUND}/ ({vendored / 1e6:.1f} MB of JavaScript and WASM)" if page else ""
    diag(f"packed {len(result['models'])} graph(s) -> {out} (default dtype {result['recommended']}){where}")
