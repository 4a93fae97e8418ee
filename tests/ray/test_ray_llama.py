"""A Llama dir (GQA, untied head, Metaspace tokenizer with byte fallback and a bos token) behind Ray Serve replicas,
as the GPT-2 dir is in test_ray_serve.py: completions, streamed or not, equal generate() on the prompt as the
checkpoint's tokenizer makes it (bos first). tests/families/test_lineage_serve.py has the same requests through
`gptedge serve`. It runs on the package's one cluster (conftest.py) and deletes its application when done."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("ray", reason="the [ray] extra is not installed")
pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")
pytest.importorskip("httpx")

from ..families.test_lineage_serve import assert_as_generate, bodies  # noqa: E402 - after the optional-dependency skips above
from ..support.ray_cluster import (PINNED, app_running, client, complete, config_from_yaml,  # noqa: E402 - after the optional-dependency skips above
                                   delete_app, deploy_config, wait_for)

pytestmark = [pytest.mark.ray, pytest.mark.slow]

APP = "llama"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from gptedge.export.exporter import export_checkpoint

    from ..support.lineage_checkpoints import write_variant_checkpoint

    root = tmp_path_factory.mktemp("ray-llama")
    checkpoint = write_variant_checkpoint(root / "ck", "gqa2-linear")
    export_checkpoint(checkpoint, root / "llama", graph_variant="kv_buffer", validate=False)
    return root / "llama"


def test_ray_replicas_answer_as_generate(cluster, url, llama_dir, tmp_path):
    """deploy/ray-serve.yaml on the two-node cluster, 2 replicas pinned one per node, the Llama dir."""
    from gptedge import runtime

    port = int(url.rsplit(":", 1)[1])
    deploy_config(cluster.address, config_from_yaml(llama_dir, APP, port, PINNED), tmp_path)
    try:
        wait_for(lambda: app_running(APP, url, 2), 240, "2 replicas running")

        async def both_answer() -> set:
            # Serve's router may learn of the second replica a moment after Serve reports it RUNNING (seen once
            # in CI under load: all 8 requests on one replica): warm until each has answered, within a bound
            seen: set = set()
            async with client(url) as http:
                for _ in range(20):
                    seen |= {a.replica for a in await asyncio.gather(*(complete(http, b) for b in bodies()))}
                    if len(seen) == 2:
                        break
            return seen

        assert len(asyncio.run(asyncio.wait_for(both_answer(), 240))) == 2

        async def run():
            async with client(url) as http:
                return await asyncio.gather(*(complete(http, b) for b in bodies() * 2))

        answers = asyncio.run(asyncio.wait_for(run(), 300))
    finally:
        delete_app(APP)
    solo = runtime.load(llama_dir, device="cpu")
    assert_as_generate(solo, answers[:4])
    assert_as_generate(solo, answers[4:])
    assert len({a.replica for a in answers}) == 2
