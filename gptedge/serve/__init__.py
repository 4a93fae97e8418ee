"""`gptedge serve`: an OpenAI-compatible HTTP server over the serving engine (docs/serving.md, docs/design.md#serving).

openai_schema: request parsing and response shapes (no HTTP); app: the Starlette routes, which only
parse, validate and stream (the engine thread owns the session). A classifier dir: classify_schema (its
shapes), classify_app (POST /v1/classify), classify_batcher (the worker thread that runs it); routes: what
both kinds share. The click command that loads the model
and runs uvicorn is gptedge/cli/serve.py, beside the other commands. Starlette and uvicorn come from the
`serve` extra.
"""
