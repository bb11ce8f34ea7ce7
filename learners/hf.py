"""The one module that imports torch and transformers (see DESIGN.md section 4).

The tiny random Llama that the demo and the tests serve with vLLM CPU, and the RoBERTa
length regressor: building, training, saving, loading and batched inference.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaForSequenceClassification,
)

# Encoders RobertaForSequenceClassification loads: roberta-base, distilroberta-base (model_type
# roberta), xlm-roberta, camembert.
ROBERTA_FAMILY = ("roberta", "xlm-roberta", "camembert")
SPECIAL = {"bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>"}
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def _byte_level_bpe(texts: Iterable[str], vocab_size: int, specials: list[str]) -> Tokenizer:
    """A byte-level BPE tokenizer trained here: any text encodes, nothing is downloaded."""
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def build_tiny_llama(
    out_dir: Path,
    texts: Iterable[str],
    *,
    vocab_size: int = 2048,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    max_positions: int = 2048,
    seed: int = 0,
) -> Path:
    """A random Llama with a byte-level BPE tokenizer trained here on ``texts``; no download."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = _byte_level_bpe(texts, vocab_size, list(SPECIAL.values()))
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=SPECIAL["bos"],
        eos_token=SPECIAL["eos"],
        pad_token=SPECIAL["pad"],
        unk_token=SPECIAL["unk"],
        model_max_length=max_positions,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.token_to_id(SPECIAL["bos"]),
        eos_token_id=tokenizer.token_to_id(SPECIAL["eos"]),
        pad_token_id=tokenizer.token_to_id(SPECIAL["pad"]),
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    (out_dir / "steersman.json").write_text(
        json.dumps({"kind": "tiny-llama", "seed": seed, "vocab_size": config.vocab_size}) + "\n"
    )
    return out_dir


# -- the RoBERTa length regressor --------------------------------------------------------------


def _train_bpe(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = _byte_level_bpe(texts, vocab_size, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer.post_processor = processors.RobertaProcessing(
        ("</s>", tokenizer.token_to_id("</s>")), ("<s>", tokenizer.token_to_id("<s>"))
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


def list_mle(scores: Any, targets: Any) -> Any:
    """ListMLE (Xia et al. 2008): the negative log-likelihood of the true order of a list under
    the Plackett-Luce model of ``scores``, per item."""
    order = torch.argsort(targets, descending=True)
    s = scores[order]
    tail = torch.logcumsumexp(s.flip(0), dim=0).flip(0)  # log sum over each item and below
    return (tail - s).mean()


class RobertaLengthModel:
    """``RobertaForSequenceClassification(num_labels=1, problem_type="regression")`` on
    ``log1p(tokens)``. ``from_scratch`` builds a small RoBERTa and a byte-level BPE tokenizer
    trained here; ``load`` opens any local HF encoder directory (production: roberta-base)."""

    def __init__(self, model: Any, tokenizer: Any, max_length: int = 256, device: str = "cpu"):
        self.model = model.to(device)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.device = device
        self.model.eval()

    @classmethod
    def from_scratch(
        cls,
        texts: Iterable[str],
        *,
        vocab_size: int = 4096,
        hidden: int = 128,
        layers: int = 2,
        heads: int = 2,
        max_length: int = 256,
        seed: int = 0,
    ) -> RobertaLengthModel:
        torch.manual_seed(seed)
        tokenizer = _train_bpe(texts, vocab_size)
        config = RobertaConfig(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            intermediate_size=hidden * 4,
            max_position_embeddings=max_length + 2,
            type_vocab_size=1,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            num_labels=1,
            problem_type="regression",
        )
        return cls(RobertaForSequenceClassification(config), tokenizer, max_length)

    @classmethod
    def load(
        cls,
        directory: Path,
        *,
        device: str = "cpu",
        max_length: int = 256,
        quantize: bool = False,
        threads: int | None = None,
    ) -> RobertaLengthModel:
        """Open a saved or pretrained directory; raise ValueError if it is not a usable model.
        ``quantize`` serves the linear layers in dynamic int8 (CPU inference several times
        faster, for a small loss of accuracy). ``threads`` sets torch's intra-op threads for
        the process: beside busy neighbours (vLLM servers on the same cores) one thread keeps
        batch-1 inference in milliseconds where two wait on each other for tens."""
        if threads is not None:
            torch.set_num_threads(threads)
        directory = Path(directory)
        try:
            config = AutoConfig.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"{directory}: not a loadable model: {exc}") from None
        if config.model_type not in ROBERTA_FAMILY:
            raise ValueError(
                f"{directory}: model_type {config.model_type!r} is not a RoBERTa-family encoder "
                f"({', '.join(ROBERTA_FAMILY)}): the length model needs one"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            model = RobertaForSequenceClassification.from_pretrained(
                directory,
                num_labels=1,
                problem_type="regression",
                local_files_only=True,
                ignore_mismatched_sizes=True,
            )
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ValueError(f"{directory}: not a loadable RoBERTa model: {exc}") from None
        if quantize and device == "cpu":
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, torch.qint8)
        # RoBERTa numbers positions from pad_token_id + 1: the window is what is left.
        window = model.config.max_position_embeddings - (model.config.pad_token_id or 0) - 1
        return cls(model, tokenizer, min(max_length, window), device)

    def save(self, directory: Path, metadata: dict[str, Any]) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        (directory / "steersman.json").write_text(json.dumps(metadata, indent=2) + "\n")
        return directory

    def _encode(self, texts: list[str]) -> Any:
        # Long prompts keep their beginning and end: truncate from the middle.
        ids = self.tokenizer(texts, add_special_tokens=False, truncation=False)["input_ids"]
        room = self.max_length - 2
        rows = []
        for seq in ids:
            if len(seq) > room:
                seq = seq[: room // 2] + seq[-(room - room // 2) :]
            rows.append([self.tokenizer.cls_token_id, *seq, self.tokenizer.sep_token_id])
        width = max(len(r) for r in rows)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = (input_ids != pad).long()
        return input_ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def predict_log(self, texts: list[str]) -> list[float]:
        """``log1p(tokens)`` per text; a batch of any size."""
        if not texts:
            return []
        self.model.eval()
        input_ids, mask = self._encode([t if t else " " for t in texts])
        out = self.model(input_ids=input_ids, attention_mask=mask).logits.squeeze(-1)
        return [float(v) for v in out.float().cpu()]

    def fit(
        self,
        texts: list[str],
        targets_log: list[float],
        *,
        val_texts: list[str],
        val_targets_log: list[float],
        epochs: int = 10,
        batch_size: int = 32,
        lr: float = 5e-4,
        patience: int = 2,
        time_budget_s: float | None = None,
        seed: int = 0,
        progress: Any = None,
        rank_weight: float = 0.0,
    ) -> dict[str, Any]:
        """Train with AdamW on MSE of ``log1p(tokens)``, plus ``rank_weight`` times ListMLE over
        each batch (the output still reads as tokens, and orders requests better); keep the best
        validation epoch, stop early on no gain or when the time budget is spent.
        ``progress(step, total, info)`` is called per batch."""
        torch.manual_seed(seed)
        generator = torch.Generator().manual_seed(seed)
        head = getattr(getattr(self.model, "classifier", None), "out_proj", None)
        if head is not None and targets_log:
            # Start the regression head at the mean target: the encoder then learns deviations.
            with torch.no_grad():
                head.bias.fill_(sum(targets_log) / len(targets_log))
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.01)
        started = time.monotonic()
        best, best_state, stale, history = math.inf, None, 0, []
        steps_per_epoch = math.ceil(len(texts) / batch_size)
        total = steps_per_epoch * epochs
        step = 0
        stopped = "epochs"
        for epoch in range(epochs):
            self.model.train()
            order = torch.randperm(len(texts), generator=generator).tolist()
            for b in range(steps_per_epoch):
                idx = order[b * batch_size : (b + 1) * batch_size]
                input_ids, mask = self._encode([texts[i] or " " for i in idx])
                labels = torch.tensor([targets_log[i] for i in idx], dtype=torch.float32)
                labels = labels.to(self.device)
                out = self.model(input_ids=input_ids, attention_mask=mask, labels=labels)
                loss = out.loss
                if rank_weight > 0:
                    loss = loss + rank_weight * list_mle(out.logits.squeeze(-1), labels)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                optimizer.step()
                step += 1
                if progress is not None:
                    progress(step, total, {"epoch": epoch + 1, "loss": float(loss.detach())})
                if time_budget_s is not None and time.monotonic() - started > time_budget_s:
                    stopped = "time budget"
                    break
            val = self.validation_mae_log(val_texts, val_targets_log)
            history.append({"epoch": epoch + 1, "val_mae_log": val})
            if val < best - 1e-4:
                best, stale = val, 0
                best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            else:
                stale += 1
            if stopped == "time budget":
                break
            if stale >= patience:
                stopped = "early stopping"
                break
        if best_state is not None:
            self.model.load_state_dict(best_state)
        self.model.eval()
        return {
            "history": history,
            "best_val_mae_log": best,
            "stopped": stopped,
            "train_seconds": round(time.monotonic() - started, 2),
            "steps": step,
        }

    def validation_mae_log(self, texts: list[str], targets_log: list[float]) -> float:
        errors = []
        for i in range(0, len(texts), 64):
            preds = self.predict_log(texts[i : i + 64])
            errors.extend(abs(p - t) for p, t in zip(preds, targets_log[i : i + 64], strict=True))
        return sum(errors) / max(1, len(errors))
