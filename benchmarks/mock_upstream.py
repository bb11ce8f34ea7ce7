"""A minimal OpenAI-compatible upstream that answers instantly (benchmarks only): the gateway's
own cost is what remains when the backend costs nothing.

python -m benchmarks.mock_upstream --port 9000 [--tokens 8]
"""

from __future__ import annotations

import argparse
import json
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse


def create(tokens: int) -> FastAPI:
    app = FastAPI()

    def chunk(n: int, last: bool) -> str:
        body = {
            "id": "mock",
            "object": "text_completion",
            "created": int(time.time()),
            "model": "mock",
            "choices": [{"index": 0, "text": " x", "finish_reason": "length" if last else None}],
            "usage": {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n},
        }
        return f"data: {json.dumps(body)}\n\n"

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "mock", "max_model_len": 4096}]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        n = min(int(body.get("max_tokens") or tokens), tokens)
        if body.get("stream"):
            parts = [chunk(k, k == n) for k in range(1, n + 1)] + ["data: [DONE]\n\n"]
            return StreamingResponse(iter(parts), media_type="text/event-stream")
        choice = {"index": 0, "text": " x" * n, "finish_reason": "length"}
        usage = {"prompt_tokens": 4, "completion_tokens": n, "total_tokens": 4 + n}
        return JSONResponse({"id": "mock", "object": "text_completion", "choices": [choice],
                             "model": "mock", "usage": usage})  # fmt: skip

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    uvicorn.run(create(args.tokens), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
