"""The one check of an error answer in OpenAI's shape, used by every HTTP test: the status, a body of exactly
{"error": {"message", "type", "param", "code"}}, and a message of one non-empty line."""

from __future__ import annotations


def openai_error(response, status: int) -> dict:
    """The `error` object of `response` (an httpx or Starlette TestClient response), checked strictly."""
    assert response.status_code == status, (response.status_code, response.text[:500])
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    message = error["message"]
    assert isinstance(message, str) and message.strip() and "\n" not in message, error
    return error
