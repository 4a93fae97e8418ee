"""`gptedge serve` on a classifier dir: POST /v1/classify against the real server (a subprocess on a free loopback
port) on the tiny seeded task heads of tests/support/task_checkpoints.py. Results equal Classifier.classify_batch's;
concurrent requests share runs (counted, never timed); every error is completions' JSON; /v1/models says what
the model does, for a language model too. The batching worker's gathering is also checked in-process, with a
classifier whose run blocks until released."""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import pytest

from gptedge.runtime.classify import Classification
from gptedge.runtime.serving.classify_batcher import BatcherQueueFull, BatcherStopped, ClassifyBatcher, ClassifyJob

from ..support.openai_errors import openai_error
from ..support.server import start_server, stop_server

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("transformers")

pytestmark = pytest.mark.interop

KEY, NAME = "test-key", "tiny"
MAX_EXAMPLES, MAX_BODY = 6, 16384
MAX_TEXT_BYTES = 64 * 128  # 64 positions of at most 128 bytes (GPT-2's longest token)
LABELS = ["contradiction", "neutral", "entailment"]
# task dir -> its examples in every form a client may send them (text; a list; an object)
EXAMPLES = {
    "gpt2-seq": [["A man sleeps.", "Nobody is awake."], {"premise": "It rains.", "hypothesis": "The road is wet."},
                 ["Two dogs run.", "Animals move."]],
    "gpt2-sim": [["A cat sat.", "The cat was sitting."], {"a": "Prices rose.", "b": "It snowed in June."}],
    "openai-seq": ["It is a truth universally acknowledged.", {"text": "Persuasion"}, "ok"],
    "gpt2-mc": [["The sky is", [" blue", " green", " made of cheese"]],
                {"context": "Two plus two is", "choices": [" four", " five"]}, ["Yes or no?", [" yes", " yes"]]],
}


def _server(model_dir, tmp_path_factory, *args):
    return start_server(model_dir, tmp_path_factory.mktemp("log") / "serve.log", "--device", "cpu", *args)


@pytest.fixture(scope="module")
def server(task_dirs, tmp_path_factory):
    """The entailment head, with an API key and small limits."""
    s = _server(task_dirs["gpt2-seq"], tmp_path_factory, "--api-key", KEY, "--max-examples", str(MAX_EXAMPLES),
                "--max-body", str(MAX_BODY))
    try:
        yield s
    finally:
        stop_server(s.proc)


def post(server, body, key=KEY, path="/v1/classify", **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, **{"timeout": 60, **kw})


def _same(entry: dict, index: int, want: Classification, keyed: bool) -> None:
    assert entry["index"] == index and entry["label"] == want.label and entry["label_index"] == want.index
    assert entry["logits"] == pytest.approx(list(want.logits), abs=1e-5)
    probabilities = entry["probabilities"]
    if keyed:
        assert list(probabilities) == list(want.labels)  # in label-index order
        probabilities = list(probabilities.values())
    assert probabilities == pytest.approx(list(want.probabilities), abs=1e-6)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_results_equal_classify_batch_for_every_task(task_dirs, tmp_path_factory, name):
    from gptedge.runtime import load_classifier

    clf = load_classifier(task_dirs[name], device="cpu")
    examples = EXAMPLES[name]
    keyed = name != "gpt2-mc"
    s = _server(task_dirs[name], tmp_path_factory)
    try:
        r = post(s, {"model": NAME, "input": examples}, key=None)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["object"] == "classification" and got["model"] == NAME and got["id"].startswith("clf-")
        want = clf.classify_batch(examples)
        assert len(got["data"]) == len(examples)
        for i, (entry, w) in enumerate(zip(got["data"], want, strict=True)):
            _same(entry, i, w, keyed)
        rows = sum(len(r) for e in examples for r in clf.example_rows(e))
        assert got["usage"] == {"prompt_tokens": rows, "total_tokens": rows}
        # one example alone (no list around it, no model: it is optional) is a list of one
        single = post(s, {"input": examples[1]}, key=None).json()
        assert len(single["data"]) == 1
        _same(single["data"][0], 0, want[1], keyed)
        card = httpx.get(f"{s.url}/v1/models").json()["data"][0]
        assert card["task"] == "classification" and card["task_name"] == clf.task.name
        assert card["labels"] == (None if name == "gpt2-mc" else clf.task.labels())
    finally:
        stop_server(s.proc)


def test_concurrent_requests_share_one_run(task_dirs, tmp_path_factory):
    """8 single-example requests sent together, with --batch-wait as a bound (a run waits up to 60 s for its 8
    rows): they run as one batch of 8 rows, each gets its own result."""
    from gptedge.runtime import load_classifier

    n = 8
    examples = [[f"Example {i} is here.", "words " * i] for i in range(n)]
    want = load_classifier(task_dirs["gpt2-seq"], device="cpu").classify_batch(examples)
    s = _server(task_dirs["gpt2-seq"], tmp_path_factory, "--max-rows", str(n), "--batch-wait", "60")
    try:
        async def all_of_them():
            async with httpx.AsyncClient(base_url=s.url, timeout=120) as http:
                return await asyncio.gather(*(http.post("/v1/classify", json={"input": [e]}) for e in examples))

        got = asyncio.run(asyncio.wait_for(all_of_them(), 300))
        for r, w in zip(got, want, strict=True):
            assert r.status_code == 200, r.text
            _same(r.json()["data"][0], 0, w, keyed=True)
        m = s.metrics()
        assert m["gptedge_classify_requests_total"] == n and m["gptedge_classify_examples_total"] == n
        assert m["gptedge_classify_batches_total"] == 1 and m["gptedge_classify_rows_total"] == n
    finally:
        stop_server(s.proc)


@pytest.mark.parametrize("body, param, message", [
    ({"input": ["A man sleeps.", "x", "y"]}, "input", "input[0]: entailment takes 2 fields"),
    ({"input": [["A", "B"], "just text"]}, "input", "input[1]: entailment takes 2 fields"),
    ({"input": [{"premise": "A"}]}, "input", "input[0]: entailment: field 'hypothesis' must be a string"),
    ({"input": [["A", 3]]}, "input", "input[0]: entailment: field 'hypothesis' must be a string"),
    ({"input": []}, "input", "input is an empty list"),
    ({"input": 7}, "input", "input must be one example or a list of them"),
    ({}, "input", "input is required"),
    ({"input": "A", "temperature": 0}, "temperature", "unrecognized request argument"),
    ({"input": ["A", "B"], "model": 3}, "model", "model must be a non-empty string"),
])
def test_bad_requests_are_400_naming_the_example(server, body, param, message):
    error = openai_error(post(server, body), 400)
    assert error["param"] == param and error["type"] == "invalid_request_error" and message in error["message"]


def test_error_paths(server, task_dirs):
    long = "one two three four " * 40  # 160 tokens: more than the 64 positions
    error = openai_error(post(server, {"input": [["short", "fine"], [long, "B"]]}), 400)
    assert error["code"] == "context_length_exceeded" and error["message"].startswith("input[1]: ")
    error = openai_error(post(server, {"input": ["x" * (MAX_TEXT_BYTES + 1), "B"]}), 400)  # refused by its bytes
    assert error["code"] == "context_length_exceeded" and f"{MAX_TEXT_BYTES + 1:,} bytes" in error["message"]
    assert openai_error(post(server, {"input": [["A", "B"]] * (MAX_EXAMPLES + 1)}), 413)["code"] == "too_many_examples"
    assert openai_error(post(server, {"input": ["A" * MAX_BODY, "B"]}), 413)["code"] == "request_too_large"
    assert openai_error(post(server, None, content=b"{not json"),
                        400)["message"] == "the request body is not valid JSON"
    assert openai_error(post(server, {"model": "gpt-4", "input": ["A", "B"]}), 404)["code"] == "model_not_found"
    for key in (None, "wrong"):
        assert openai_error(post(server, {"input": ["A", "B"]}, key=key), 401)["code"] == "invalid_api_key"
        assert openai_error(post(server, {"model": NAME, "prompt": "Hi"}, key=key, path="/v1/completions"), 401)
    error = openai_error(post(server, {"model": "gpt-4", "prompt": "Hi"}, path="/v1/completions"), 400)
    assert error["code"] == "unsupported_task" and "an entailment classifier" in error["message"]
    assert "POST /v1/classify" in error["message"]
    # after all of these, it still answers
    assert post(server, {"input": ["A", "B"]}).json()["data"][0]["label"] in LABELS


def test_models_health_and_metrics(server, task_dirs):
    name = NAME  # start_server's --model-name
    models = httpx.get(f"{server.url}/v1/models", headers={"Authorization": f"Bearer {KEY}"}).json()
    card = models["data"][0]
    assert card == {"id": name, "object": "model", "created": card["created"], "owned_by": "gptedge",
                    "task": "classification", "task_name": "entailment", "endpoint": "/v1/classify",
                    "input_fields": ["premise", "hypothesis"], "labels": LABELS, "context_length": 64}
    one = httpx.get(f"{server.url}/v1/models/{name}", headers={"Authorization": f"Bearer {KEY}"})
    assert one.json() == card
    assert httpx.get(f"{server.url}/v1/models").status_code == 401
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "model": name}
    before = server.metrics()
    assert post(server, {"input": [["A", "B"], ["C", "D"], ["E", "F"]]}).status_code == 200
    assert post(server, {"input": ["A"]}).status_code == 400  # refused before the queue: not counted there
    m = server.metrics()
    assert m["gptedge_classify_requests_total"] == before["gptedge_classify_requests_total"] + 1
    assert m["gptedge_classify_examples_total"] == before["gptedge_classify_examples_total"] + 3
    assert m["gptedge_classify_rows_total"] == before["gptedge_classify_rows_total"] + 3
    assert m["gptedge_classify_queue_depth"] == 0
    ok, bad = ('gptedge_http_requests_total{path="/v1/classify",status="%d"}' % s for s in (200, 400))
    assert m[ok] == before.get(ok, 0) + 1 and m[bad] == before.get(bad, 0) + 1


def test_a_language_model_says_so_and_refuses_classify(gpt2_model_dir, tmp_path_factory):
    s = _server(gpt2_model_dir, tmp_path_factory, "--web", "off")
    try:
        card = httpx.get(f"{s.url}/v1/models").json()["data"][0]
        assert card["task"] == "text-generation" and card["endpoint"] == "/v1/completions" and card["id"] == NAME
        error = openai_error(post(s, {"input": "Hi"}, key=None), 400)
        assert error["code"] == "unsupported_task" and "language model (text-generation)" in error["message"]
        assert "POST /v1/completions" in error["message"]
        assert post(s, {"model": NAME, "prompt": "Hi", "max_tokens": 2}, key=None, path="/v1/completions").json()[
            "choices"]
        assert "gptedge_classify" not in httpx.get(f"{s.url}/metrics").text
    finally:
        stop_server(s.proc)


def test_sigterm_runs_the_waiting_request_and_exits_zero(task_dirs, tmp_path_factory):
    """A request waiting for its batch (--batch-wait 60: it would wait a minute) when SIGTERM comes runs at
    once and gets its answer; the server then exits 0."""
    s = _server(task_dirs["gpt2-seq"], tmp_path_factory, "--max-rows", "8", "--batch-wait", "60",
                "--shutdown-timeout", "30")
    try:
        answer = {}
        thread = threading.Thread(target=lambda: answer.setdefault("r", post(s, {"input": ["A", "B"]}, key=None)))
        thread.start()
        deadline = time.monotonic() + 60
        while s.metrics()["gptedge_classify_requests_total"] < 1:  # it waits in the batcher
            assert time.monotonic() < deadline
            time.sleep(0.05)
        s.proc.send_signal(signal.SIGTERM)
        thread.join(30)  # without SIGTERM it would still wait for its batch (60 s)
        assert "r" in answer and answer["r"].status_code == 200 and answer["r"].json()["data"][0]["label"] in LABELS
        assert s.proc.wait(60) == 0
        log = s.log.read_text()
        assert "server stopped" in log and "Traceback" not in log
    finally:
        stop_server(s.proc)


# -- the batching worker, in-process -------------------------------------------------------------------------
class BlockingClassifier:
    """classify_rows records each batch's rows and blocks until `release` is set; one label per row count."""

    def __init__(self):
        self.batches, self.entered, self.release = [], threading.Event(), threading.Event()

    def classify_rows(self, example_rows, batch_size, choices=None):
        self.batches.append([r[0][0] for r in example_rows])  # each example's first token: which one it is
        self.entered.set()
        assert self.release.wait(60)
        return [Classification(("a",), (float(r[0][0]),), (1.0,)) for r in example_rows]


def _job(results: dict, *ids: int, rows_each: int = 1) -> ClassifyJob:
    def done(res, err) -> None:
        results[ids[0]] = err if err is not None else [r.logits[0] for r in res]
    return ClassifyJob([[[i]] * rows_each for i in ids], None, done)


def test_the_worker_gathers_requests_that_arrive_during_a_run():
    clf, results = BlockingClassifier(), {}
    batcher = ClassifyBatcher(clf, max_rows=4, max_queue=8).start()
    try:
        batcher.submit(_job(results, 1))
        assert clf.entered.wait(60)  # the first run is in progress: everything below arrives during it
        batcher.submit(_job(results, 2))
        batcher.submit(_job(results, 3, 4))
        gone = batcher.submit(_job(results, 5))
        gone.cancel()  # its client left: never run
        batcher.submit(_job(results, 6, 7))  # would make 5 rows: waits at the head for the next batch
        batcher.submit(_job(results, 8))  # never overtakes it
        clf.release.set()
    finally:
        batcher.stop(grace_s=60)
    assert clf.batches == [[1], [2, 3, 4], [6, 7, 8]]
    assert results == {1: [1.0], 2: [2.0], 3: [3.0, 4.0], 6: [6.0, 7.0], 8: [8.0]}
    assert batcher.metrics.batches == 3 and batcher.metrics.requests == 6 and batcher.metrics.rows == 7


def test_a_job_larger_than_max_rows_runs_alone_and_the_queue_is_bounded():
    clf, results = BlockingClassifier(), {}
    clf.release.set()
    batcher = ClassifyBatcher(clf, max_rows=2, max_queue=2).start()
    try:
        batcher.submit(_job(results, 1, 2, 3))
        assert clf.entered.wait(60)
    finally:
        batcher.stop(grace_s=60)
    assert clf.batches == [[1, 2, 3]] and results == {1: [1.0, 2.0, 3.0]}
    clf.release.clear()
    clf.entered.clear()
    batcher = ClassifyBatcher(clf, max_rows=2, max_queue=2).start()
    batcher.submit(_job(results, 10))
    assert clf.entered.wait(60)
    batcher.submit(_job(results, 11))
    batcher.submit(_job(results, 12))
    with pytest.raises(BatcherQueueFull):
        batcher.submit(_job(results, 13))
    threading.Timer(0.2, clf.release.set).start()
    batcher.stop(grace_s=0)  # the queued ones end at once; the running one finishes
    assert isinstance(results[11], BatcherStopped) and isinstance(results[12], BatcherStopped)
    assert results[10] == [10.0]
    with pytest.raises(BatcherStopped):
        batcher.submit(_job(results, 14))


def test_a_failing_run_or_callback_ends_only_its_own_requests():
    class Failing(BlockingClassifier):
        def classify_rows(self, example_rows, batch_size, choices=None):
            if example_rows[0][0][0] == 1:
                raise RuntimeError("the run broke")
            return super().classify_rows(example_rows, batch_size, choices)

    clf, results = Failing(), {}
    clf.release.set()
    batcher = ClassifyBatcher(clf, max_rows=1, max_queue=8).start()
    try:
        batcher.submit(_job(results, 1))
        batcher.submit(ClassifyJob([[[2]]], None, lambda res, err: 1 / 0))  # its callback raises
        batcher.submit(_job(results, 3))
    finally:
        batcher.stop(grace_s=60)
    assert isinstance(results[1], RuntimeError) and results[3] == [3.0]  # the worker lived on
