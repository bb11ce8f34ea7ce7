"""The one module that imports torch and transformers (see DESIGN.md section 4).

The tiny random Llama that the demo and the tests serve with vLLM CPU, and the length regressor
on any Hugging Face encoder: building, fine-tuning, saving, loading and batched inference.
"""

from __future__ import annotations

import json
import math
import random
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    RobertaConfig,
    RobertaModel,
)
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES
from transformers.utils import logging as hf_logging

# steersman reports its own progress: transformers' bars ("Writing model shards") carry nothing.
hf_logging.disable_progress_bar()
# Loading a base into the length model's shape reports weights it leaves out (a masked-LM head,
# the layers beyond those kept) on every load: expected here, and nothing for a user to act on.
hf_logging.set_verbosity_error()

HEAD_FILE = "length_head.safetensors"  # the regression head beside a fine-tuned encoder
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


# -- the length regressor ------------------------------------------------------------------------


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


class _Pooled(torch.nn.Module):
    """An encoder's last hidden states, mean-pooled over the prompt's tokens, into one linear
    unit: how sentence encoders are read (all-MiniLM was trained for mean pooling)."""

    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = torch.nn.Linear(encoder.config.hidden_size, 1)

    def forward(self, input_ids: Any, mask: Any) -> Any:
        return self.head(self.pool(input_ids, mask)).squeeze(-1)

    def pool(self, input_ids: Any, mask: Any) -> Any:
        """The prompt's vector: what the head reads (and the similar-prompt prior compares)."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)

    def bias(self) -> Any:
        return self.head.bias


class _Scored(torch.nn.Module):
    """A ``_Pooled`` network's prediction with the prompt's vector, in one pass: what serving
    runs (and traces), so the vector costs nothing beyond the prediction."""

    def __init__(self, net: _Pooled) -> None:
        super().__init__()
        self.net = net

    def forward(self, input_ids: Any, mask: Any) -> tuple[Any, Any]:
        pooled = self.net.pool(input_ids, mask)
        return self.net.head(pooled).squeeze(-1), pooled


class _Classifier(torch.nn.Module):
    """A ``*ForSequenceClassification`` checkpoint with one regression output (the length models
    steersman saved before its pooled head, or any such model of the operator's)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Any, mask: Any) -> Any:
        return self.model(input_ids=input_ids, attention_mask=mask).logits.squeeze(-1)

    def bias(self) -> Any:
        head = getattr(self.model, "classifier", None)
        head = getattr(head, "out_proj", head)
        return getattr(head, "bias", None)


def _encoder_type(directory: Path) -> str:
    """The directory's ``model_type``, refused unless transformers loads it as an encoder."""
    try:
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        named = _declared_type(directory)
        if named is not None and f"`{named}`" in str(exc):
            raise ValueError(
                f"{directory}: model_type {named!r} is not an architecture this transformers "
                "release can load"
            ) from None
        raise ValueError(f"{directory}: not a loadable model: {exc}") from None
    kind = config.model_type
    if kind not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or config.is_encoder_decoder:
        raise ValueError(
            f"{directory}: model_type {kind!r} is not an encoder (RoBERTa, BERT/MiniLM, MPNet, "
            "DeBERTa and other masked-language models are): the length model needs one"
        )
    return kind


def _declared_type(directory: Path) -> str | None:
    try:
        return json.loads((Path(directory) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


class LengthModel:
    """``log1p(tokens)`` of a prompt's answer, from a Hugging Face encoder: its hidden states
    mean-pooled into a linear head (``_Pooled``). ``from_scratch`` builds a small RoBERTa and a
    byte-level BPE tokenizer trained here; ``load`` opens any local encoder directory that
    ``AutoModel`` loads (a pretrained base such as all-MiniLM or roberta-base, whose head is
    new until ``fit``; or a length model saved by ``save``), or a one-output
    ``*ForSequenceClassification`` regressor. ``trained`` says whether the head has learned."""

    def __init__(
        self,
        net: Any,
        tokenizer: Any,
        max_length: int = 256,
        device: str = "cpu",
        *,
        model_type: str = "roberta",
        trained: bool = True,
    ):
        try:
            self.net = net.to(device)
        except (RuntimeError, AssertionError) as exc:  # no such device, or not in this build
            raise ValueError(f"device {device!r}: {exc}") from None
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.device = device
        self.model_type = model_type
        self.trained = trained
        # What predictions run: (values, vectors) from a pooled network, values alone from a
        # classifier; a traced graph of it, when compiled.
        self.forward = _Scored(self.net) if isinstance(self.net, _Pooled) else self.net
        self.net.eval()

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
    ) -> LengthModel:
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
        )
        encoder = RobertaModel(config, add_pooling_layer=False)
        return cls(_Pooled(encoder), tokenizer, max_length, trained=False)

    @classmethod
    def load(
        cls,
        directory: Path,
        *,
        device: str = "cpu",
        max_length: int = 256,
        quantize: bool = False,
        threads: int | None = None,
        layers: int | None = None,
        compiled: bool = False,
    ) -> LengthModel:
        """Open a saved or pretrained directory; raise ValueError naming the file or the field
        when it is not a usable encoder. ``quantize`` serves the linear layers in dynamic int8
        (CPU inference several times faster, for a small loss of accuracy). ``threads`` sets
        torch's intra-op threads for the process: beside busy neighbours (vLLM servers on the
        same cores) one thread keeps batch-1 inference in milliseconds where two wait on each
        other for tens. ``layers`` keeps only a pretrained base's first layers (to fine-tune it
        smaller and faster: its lower layers carry most of what a prompt says about its
        answer's length; a trained length model loads as it was saved). ``compiled`` serves a
        traced graph of the network (half the batch-1 time on a CPU core: transformers' Python
        around each layer costs as much as the layer); such a model predicts, it does not
        train."""
        if threads is not None:
            torch.set_num_threads(threads)
        directory = Path(directory)
        kind = _encoder_type(directory)
        config = AutoConfig.from_pretrained(directory, local_files_only=True)
        archs = config.architectures or []
        classifier = config.num_labels == 1 and any(
            a.endswith("ForSequenceClassification") for a in archs
        )
        head = directory / HEAD_FILE
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
            if classifier and not head.exists():
                net: Any = _Classifier(
                    AutoModelForSequenceClassification.from_pretrained(
                        directory, local_files_only=True
                    )
                )
            else:
                trimmed = layers is not None and not head.exists()  # a trained model stays whole
                extra = {"num_hidden_layers": layers} if trimmed else {}
                net = _Pooled(AutoModel.from_pretrained(directory, local_files_only=True, **extra))
                if head.exists():
                    net.head.load_state_dict(load_file(str(head)))
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ValueError(f"{directory}: not a loadable {kind} encoder: {exc}") from None
        if quantize and device == "cpu":
            net = _int8(net)
        window = config.max_position_embeddings
        if kind in ("roberta", "xlm-roberta", "camembert"):
            # RoBERTa numbers positions from pad_token_id + 1: the window is what is left.
            window -= (config.pad_token_id or 0) + 1
        trained = head.exists() or classifier
        model = cls(net, tokenizer, min(max_length, window), device, model_type=kind,
                    trained=trained)  # fmt: skip
        if compiled:
            example = model._encode(["How long will the answer to this be?"])
            model.forward = _traced(model.forward, example)
        return model

    def save(self, directory: Path, metadata: dict[str, Any]) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if isinstance(self.net, _Pooled):
            self.net.encoder.save_pretrained(directory, safe_serialization=True)
            head = {k: v.contiguous() for k, v in self.net.head.state_dict().items()}
            save_file(head, str(directory / HEAD_FILE))
        else:
            self.net.model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        meta = {"model_type": self.model_type, "head": type(self.net).__name__, **metadata}
        (directory / "steersman.json").write_text(json.dumps(meta, indent=2) + "\n")
        return directory

    def _encode(self, texts: list[str]) -> Any:
        tok = self.tokenizer
        ids = tok(texts, add_special_tokens=False, truncation=False)["input_ids"]
        # The encoder's sentence markers: [CLS] ... [SEP] (BERT), <s> ... </s> (RoBERTa).
        first = tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id
        last = tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id
        head, tail = [t for t in (first,) if t is not None], [t for t in (last,) if t is not None]
        room = max(self.max_length - len(head) - len(tail), 1)
        rows = []
        for seq in ids:
            if len(seq) > room:  # long prompts keep their beginning and end
                seq = seq[: room // 2] + seq[len(seq) - (room - room // 2) :]
            rows.append(head + seq + tail)
        width = max(len(r) for r in rows)
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        input_ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        return input_ids.to(self.device), mask.to(self.device)

    def predict_log(self, texts: list[str]) -> list[float]:
        """``log1p(tokens)`` per text; a batch of any size; any text (empty, only special
        tokens, longer than the window) gives a number."""
        return self.predict_with_vectors(texts, vectors=False)[0]

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
        head_lr: float | None = None,
        patience: int = 2,
        time_budget_s: float | None = None,
        seed: int = 0,
        progress: Any = None,
        rank_weight: float = 0.0,
    ) -> dict[str, Any]:
        """Train with AdamW on MSE of ``log1p(tokens)``, plus ``rank_weight`` times ListMLE over
        each batch (the output still reads as tokens, and orders requests better); keep the best
        validation epoch, stop early on no gain or when the time budget is spent. The head
        learns at ``head_lr`` (default ``lr``; a new head on a pretrained encoder wants more).
        Batches hold prompts of similar length (drawn at random from a pool of 50 batches), so
        little of a CPU's time goes to padding. ``progress(step, total, info)`` is called per
        batch."""
        torch.manual_seed(seed)
        rng = random.Random(seed)
        bias = self.net.bias()
        if bias is not None and targets_log and not self.trained:
            # Start a new head at the mean target: the encoder then learns deviations.
            with torch.no_grad():
                bias.fill_(sum(targets_log) / len(targets_log))
        head = [p for n, p in self.net.named_parameters() if n.startswith("head.")]
        rest = [p for n, p in self.net.named_parameters() if not n.startswith("head.")]
        optimizer = torch.optim.AdamW(
            [{"params": rest, "lr": lr}, {"params": head, "lr": head_lr or lr}],
            weight_decay=0.01,
        )
        lengths = [len(t) for t in texts]
        started = time.monotonic()
        best, best_state, stale, history = math.inf, None, 0, []
        steps_per_epoch = math.ceil(len(texts) / batch_size)
        total = steps_per_epoch * epochs
        step = 0
        stopped = "epochs"
        for epoch in range(epochs):
            self.net.train()
            for idx in _similar_length_batches(lengths, batch_size, rng):
                input_ids, mask = self._encode([texts[i] or " " for i in idx])
                labels = torch.tensor([targets_log[i] for i in idx], dtype=torch.float32)
                labels = labels.to(self.device)
                out = self.net(input_ids, mask)
                loss = torch.nn.functional.mse_loss(out, labels)
                if rank_weight > 0 and len(idx) > 1:
                    loss = loss + rank_weight * list_mle(out, labels)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
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
                best_state = {k: v.detach().clone() for k, v in self.net.state_dict().items()}
            else:
                stale += 1
            if stopped == "time budget":
                break
            if stale >= patience:
                stopped = "early stopping"
                break
        if best_state is not None:
            self.net.load_state_dict(best_state)
        self.net.eval()
        self.trained = True
        return {
            "history": history,
            "best_val_mae_log": best,
            "stopped": stopped,
            "train_seconds": round(time.monotonic() - started, 2),
            "steps": step,
        }

    def validation_mae_log(self, texts: list[str], targets_log: list[float]) -> float:
        preds = self.predict_many(texts)
        errors = [abs(p - t) for p, t in zip(preds, targets_log, strict=True)]
        return sum(errors) / max(1, len(errors))

    @torch.inference_mode()
    def predict_with_vectors(
        self, texts: list[str], *, vectors: bool = True
    ) -> tuple[list[float], list[Any]]:
        """``predict_log`` and each prompt's vector (the mean-pooled encoder state that the head
        reads, a float32 array; None per prompt for a classifier checkpoint, which has none,
        and without ``vectors``)."""
        if not texts:
            return [], []
        self.net.eval()
        input_ids, mask = self._encode([t if t and t.strip() else " " for t in texts])
        out = self.forward(input_ids, mask)
        pooled = None
        if isinstance(out, tuple):
            out, pooled = out
        values = [float(v) for v in out.float().cpu()]
        if pooled is None or not vectors:
            return values, [None] * len(texts)
        return values, list(pooled.float().cpu().numpy())

    def predict_many(self, texts: list[str], batch_size: int = 64) -> list[float]:
        """``predict_log`` over many texts, in batches of similar length (less padding)."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out = [0.0] * len(texts)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            for i, v in zip(idx, self.predict_log([texts[i] for i in idx]), strict=True):
                out[i] = v
        return out


def _similar_length_batches(
    lengths: list[int], batch_size: int, rng: random.Random, pool: int = 50
) -> list[list[int]]:
    """An epoch's batches: a random order, cut into pools of ``pool`` batches, each pool sorted
    by length and cut into batches, the batches shuffled.

    >>> batches = _similar_length_batches([5, 1, 4, 2, 3, 6], 2, random.Random(0), pool=3)
    >>> sorted(sorted(b) for b in batches)
    [[0, 5], [1, 3], [2, 4]]
    """
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size * pool):
        chunk = sorted(order[start : start + batch_size * pool], key=lengths.__getitem__)
        batches += [chunk[k : k + batch_size] for k in range(0, len(chunk), batch_size)]
    rng.shuffle(batches)
    return batches


def _traced(net: Any, example: tuple[Any, Any]) -> Any:
    """``net`` as a TorchScript graph traced on one example: any batch size and length runs the
    same operations (an encoder's attention has no branch on the data; the tests compare padded
    batches with the eager network). ``torch.jit.trace`` is deprecated in favour of
    torch.compile, which compiles C++ at start-up and again for new shapes; tracing takes a
    second, and its warnings (deprecation, Python booleans the tracer cannot follow in
    transformers' mask helpers, all shape checks here) tell an operator nothing."""
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        return torch.jit.trace(net.eval(), example, check_trace=False, strict=False)


def _int8(net: Any) -> Any:
    """Dynamic int8 linear layers (weights int8, activations quantized per batch) for CPU
    serving. torch.ao's eager dynamic quantization still ships in torch 2.13 and is the fastest
    CPU path measured here (docs/predictions.md); it warns of its future removal on every call,
    which tells an operator nothing."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.ao\.quantization is deprecated")
        warnings.filterwarnings("ignore", message=r".*quantized tensor creation functions")
        return torch.ao.quantization.quantize_dynamic(net, {torch.nn.Linear}, torch.qint8)
