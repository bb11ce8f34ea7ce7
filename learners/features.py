"""Request features for the length predictors: a pure function of the request, never raising.

Request class, by the first rule that matches:
1. ``code``: the prompt carries code (a fenced block, or code punctuation on several lines) or
   asks for it (write/implement/fix a function, class, script, program, query, regex, or names
   a programming language);
2. ``summarization``: it asks to summarize, condense or give the gist/TL;DR;
3. ``chat``: a conversation of more than one turn, or a question (ends with "?" or starts with a
   question word);
4. ``other``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

CLASSES = ("chat", "code", "summarization", "other")

_QUESTION_WORDS = re.compile(
    r"\b(what|why|how|when|where|who|whom|which|whose|can|could|should|would|is|are|do|does)\b",
    re.I,
)
_CODE_ASK = re.compile(
    r"\b(write|implement|create|fix|debug|refactor|complete|generate)\b[^.?!\n]{0,60}"
    r"\b(function|method|class|script|program|code|query|regex|algorithm|snippet)\b",
    re.I,
)
_LANGUAGES = re.compile(
    r"\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|ruby|php|sql|bash|html|css|"
    r"kotlin|swift|scala|haskell|matlab|numpy|pandas|react)\b",
    re.I,
)
_CODE_LINE = re.compile(r"[;{}]\s*$|^\s*(def|class|import|return|for|while|if)\b|=>|==|\(\)", re.M)
_SUMMARY = re.compile(r"\b(summari[sz]e|summary|tl;?dr|condense|gist|in short|recap)\b", re.I)
_WORDS_HINT = re.compile(
    r"\b(?:in|within|under|about|at most|no more than)\s+(\d{1,4})\s+words?\b", re.I
)
_SENTENCES_HINT = re.compile(r"\b(\d{1,3}|one|two|three|four|five)\s+sentences?\b", re.I)
_LIST_HINT = re.compile(
    r"\b(?:list|give|name|provide|suggest|generate)\s+(?:me\s+)?(\d{1,3})\b|"
    r"\b(\d{1,3})\s+(?:examples|ideas|tips|ways|reasons|items|steps|questions|facts|names|words)\b",
    re.I,
)
_BRIEF = re.compile(
    r"\b(briefly|brief|concise|short|one word|a word|one sentence|in a nutshell|"
    r"single sentence|yes or no)\b",
    re.I,
)
_DETAILED = re.compile(
    r"\b(step[- ]by[- ]step|in detail|detailed|elaborate|comprehensive|"
    r"thorough|explain)\b",
    re.I,
)
_LONG_FORM = re.compile(
    r"\b(essay|article|story|blog post|report|poem|letter|speech|script|"
    r"cover letter|outline)\b",
    re.I,
)
_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def prompt_text(prompt: Any = None, messages: Any = None) -> tuple[str, int]:
    """The text a predictor reads and the number of chat turns, from either request shape.

    For chat it is the last user message (the first user turn of a fresh conversation).
    """
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        turns = [m for m in messages if isinstance(m, Mapping)]
        users = [m for m in turns if m.get("role") == "user"]
        last = users[-1] if users else (turns[-1] if turns else {})
        return _content_text(last.get("content")), len(turns)
    if isinstance(prompt, str):
        return prompt, 1
    if isinstance(prompt, Sequence) and prompt and isinstance(prompt[0], str):
        return "\n".join(p for p in prompt if isinstance(p, str)), 1
    return "", 1


def conversation_text(prompt: Any = None, messages: Any = None) -> str:
    """The whole input as one text, every message after its role: what a prefix cache sees
    (a chat's next turn starts with the same text as the one before).

    >>> conversation_text(messages=[{"role": "user", "content": "hi"}])
    '<|user|>\\nhi\\n<|assistant|>\\n'
    """
    if isinstance(messages, Sequence) and not isinstance(messages, str):
        turns = [m for m in messages if isinstance(m, Mapping)]
        text = "".join(f"<|{m.get('role')}|>\n{_content_text(m.get('content'))}\n" for m in turns)
        return text + "<|assistant|>\n"
    return prompt_text(prompt=prompt)[0]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # OpenAI content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def request_class(text: str, turns: int = 1) -> str:
    if (
        "```" in text
        or len(_CODE_LINE.findall(text)) >= 2
        or _CODE_ASK.search(text)
        or _LANGUAGES.search(text)
    ):
        return "code"
    if _SUMMARY.search(text):
        return "summarization"
    stripped = text.strip()
    if turns > 1 or stripped.endswith("?") or _QUESTION_WORDS.match(stripped):
        return "chat"
    return "other"


def request_features(
    text: str,
    *,
    prompt_tokens: int | None = None,
    max_tokens: int | None = None,
    turns: int = 1,
) -> dict[str, float | str]:
    """Numeric features plus ``request_class``; any input gives a dict, never an exception.

    >>> f = request_features("Briefly, list 5 tips for sleeping well?", prompt_tokens=9)
    >>> f["request_class"], f["list_n"], f["brief"], f["question_words"]
    ('chat', 5.0, 1.0, 0.0)
    >>> request_features("Write a Python function that reverses a string.")["request_class"]
    'code'
    """
    text = text if isinstance(text, str) else ""
    words = text.split()
    hint_words = _first_int(_WORDS_HINT, text)
    sentences = _first_int(_SENTENCES_HINT, text)
    list_n = _first_int(_LIST_HINT, text)
    tokens = prompt_tokens if isinstance(prompt_tokens, int) and prompt_tokens >= 0 else None
    limit = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else None
    return {
        "request_class": request_class(text, turns),
        "prompt_tokens_log": math.log1p(tokens if tokens is not None else len(words) * 1.3),
        "prompt_words_log": math.log1p(len(words)),
        "lines": float(min(text.count("\n") + 1, 200)),
        "question_marks": float(min(text.count("?"), 10)),
        "question_words": float(min(len(_QUESTION_WORDS.findall(text[:200])), 10)),
        "code_fences": float(min(text.count("```"), 10)),
        "code_lines": float(min(len(_CODE_LINE.findall(text)), 50)),
        "mentions_language": float(bool(_LANGUAGES.search(text))),
        "hint_words_log": math.log1p(hint_words) if hint_words else 0.0,
        "hint_sentences": float(min(sentences or 0, 50)),
        "list_n": float(min(list_n or 0, 100)),
        "brief": float(bool(_BRIEF.search(text))),
        "detailed": float(bool(_DETAILED.search(text))),
        "long_form": float(bool(_LONG_FORM.search(text))),
        "summarize": float(bool(_SUMMARY.search(text))),
        "max_tokens_log": math.log1p(limit) if limit else 0.0,
        "turns": float(min(max(turns, 1), 100)),
    }


def _first_int(pattern: re.Pattern[str], text: str) -> int | None:
    match = pattern.search(text)
    if not match:
        return None
    raw = next((g for g in match.groups() if g), None)
    if raw is None:
        return None
    return _NUMBER_WORDS.get(raw.lower()) or (int(raw) if raw.isdigit() else None)
