"""The bundled data sets: real prompts with real responses and real arrival traces.

Sources, transformations and licences of every file are in README.md beside this file.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PROMPT_SETS = {
    "alpaca": "alpaca_5k.jsonl.gz",
    "codealpaca": "codealpaca.jsonl.gz",
    "alpaca_eval": "alpaca_eval_12models.jsonl.gz",
}
TRACES = {
    "azure_conv": "azure_llm_2023_conv.csv",
    "azure_code": "azure_llm_2023_code.csv",
    "mooncake": "mooncake_conversation.csv",
}
# The Mooncake trace again, with each request's prefix-block hash ids (512 tokens a block).
PREFIX_TRACES = {"mooncake_hashes": "mooncake_conversation_hashes.jsonl.gz"}


def path(name: str) -> Path:
    """The file of a bundled prompt set or trace, by short name or file name."""
    filename = PROMPT_SETS.get(name) or TRACES.get(name) or PREFIX_TRACES.get(name) or name
    located = resources.files(__name__) / filename
    if not located.is_file():
        known = ", ".join([*PROMPT_SETS, *TRACES, *PREFIX_TRACES])
        raise FileNotFoundError(f"no bundled data set {name!r}; known: {known}")
    return Path(str(located))
