"""Token counts in the served model's tokens, through the `tokenizers` library.

Every length steersman predicts, schedules or scores is counted in the tokens of the model the
instances serve: the response texts of the data sets are tokenized with that model's tokenizer
(the tiny demo model's in tests and the demo, the production model's in production).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer


class TokenCounter:
    """Counts tokens with a model directory's ``tokenizer.json``, without special tokens."""

    def __init__(self, model_dir: Path) -> None:
        path = Path(model_dir) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{model_dir}: no tokenizer.json (a fast HF tokenizer)")
        self.tokenizer = Tokenizer.from_file(str(path))

    def count(self, text: str) -> int:
        return len(self.ids(text))

    def ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def count_many(self, texts: Sequence[str]) -> list[int]:
        encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encoded]
