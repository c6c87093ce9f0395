"""``kl_weight``: a KL anchor to the starting model on general prompts, its weight changed mid-run.

    loss = task loss + w · KL(reference ‖ current)   on a batch of anchor prompts each step

The learning rate only moves a run along one learn-versus-forget curve; a restoring force moves
the curve (self-distillation on general data, as PPO-ptx, SDFT and "RL's Razor" do). ``w`` is
the knob, a Lagrange multiplier the service's constraint controller turns (``kind: constraint``
in a policy, ``preset:protect-capability``).

Three ways to use it, all computing the same term:

* HF ``Trainer`` / TRL ``SFTTrainer`` (or any ``Trainer`` subclass): ``anchor_trainer(SFTTrainer)``
  returns the class with :class:`KLAnchorMixin` in front, which adds the term in ``compute_loss``
  (the method ``Trainer`` documents for subclassing), the ``anchor/*`` values in ``log``, and a
  callback that builds the reference at train begin and keeps the anchor's state in checkpoints::

      trainer = anchor_trainer(SFTTrainer)(model=model, args=args, train_dataset=ds,
                                           kl_anchor=KLAnchor(general_texts, tokenizer))
      ActuatorCallback("preset:protect-capability", knobs={"kl_weight": {}}, probes=[...]).attach(trainer)

* A trainer already built (TRL's own scripts): :func:`install_anchor` puts an anchor on it (the
  same class and callback). ``ActuatorCallback`` does it by itself when its policy turns
  ``kl_weight`` and the trainer holds preference pairs and no anchor: the anchor texts are the
  trainer's own pairs, prompt + chosen (:func:`pair_token_ids`).
* A plain PyTorch loop: ``anchor.setup(model)`` once before training, then
  ``loss = task_loss + anchor.term(model)`` every step (``term`` is 0 without a forward while w = 0).
* Any loop: :class:`KLAnchorKnob` is the knob setter the callback binds (``name = "kl_weight"``).

**What is cached, and why.** The reference is the model at ``setup`` (train begin): the starting
model, or, for a PEFT model, the base with its adapters disabled. Rather than keeping a frozen
copy (540 MB for SmolLM2-135M in fp32, plus a reference forward every step), ``setup`` runs the
reference once over the anchor set and keeps, per token position, its top-``k`` next-token
log-probs and the log of the remaining ("tail") mass. The anchor term is then the KL between the
(k+1)-bucket coarsenings of the two distributions: exact when the reference's tail mass is 0 and
otherwise a lower bound of the full KL (coarsening never increases KL). With k = 64 on SmolLM2
the cache is ~0.5 KB per anchor token (1.5 MB for 48 prompts × 64 tokens), and **no reference
forward runs during training at all**; while w = 0 not even the current model runs on the anchor
batch, so the anchor costs nothing until the controller turns it on.

Anchor batches are drawn with the anchor's own RNG (saved in checkpoints), never the global one:
the training batch order and dropout masks are the ones the run would have without the anchor.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from typing import Any

try:
    import torch
    import torch.nn.functional as F
except ImportError as exc:
    from .models import training_stack_missing

    raise training_stack_missing("actuator.agents.anchor", exc) from exc

from actuator._exceptions import ConfigError

from .knobs import KnobNotSupported, knob_setter
from .probes._common import check_texts, encode, is_peft_model, pad_batch, pad_token_id, probe_mode, subsample
from .sharded import reshard

__all__ = ["reading_set", "KLAnchor", "KLAnchorKnob", "KLAnchorMixin", "KLAnchorCallback", "anchor_trainer", "install_anchor",
           "pair_token_ids", "bucket_kl"]

STATE_FILE = "actuator-anchor.pt"
_TINY = 1e-30


def bucket_kl(cur_logits: torch.Tensor, top_idx: torch.Tensor, top_logp: torch.Tensor,
              tail_logp: torch.Tensor) -> torch.Tensor:
    """KL(ref ‖ cur) per position between the (k+1)-bucket coarsenings: the reference's top-k
    tokens one by one, everything else as one tail bucket.

    ``cur_logits`` [..., V]; ``top_idx``/``top_logp`` [..., k] (the reference's top-k ids and
    log-probs); ``tail_logp`` [...] (log of the reference's remaining mass, floored at a tiny
    positive number so every value stays finite). Returns [...].
    """
    logp = F.log_softmax(cur_logits.float(), dim=-1)
    cur_top = logp.gather(-1, top_idx.long())
    top_p = top_logp.exp()
    head = (top_p * (top_logp - cur_top)).sum(-1)
    # log of the current model's mass outside the reference's top-k, stably: log(1 - sum p_top)
    cur_tail = torch.log((-torch.expm1(torch.logsumexp(cur_top, dim=-1))).clamp_min(1e-12))
    return head + tail_logp.exp() * (tail_logp - cur_tail)


def _answer_start(ids: list[int], marker: list[int]) -> int:
    """The position of ``marker``'s last token at its last occurrence in ``ids`` (it predicts the
    answer's first token), or 0 when ``ids`` does not contain it (plain text: every position)."""
    m = len(marker)
    for end in range(len(ids) - m, -1, -1):
        if ids[end:end + m] == marker:
            return end + m - 1
    return 0


class KLAnchor:
    """The anchor term and its weight.

    Args:
        texts: general text the model must not forget (chat-formatted prompts with answers, plain
            text, ...). Keep them disjoint from the prompts your capability probes measure, so a
            controller cannot pass its probe by anchoring on it. None when ``token_ids`` is given.
        tokenizer: the training tokenizer.
        token_ids: the anchor texts already tokenized (a trainer's own tokenized pairs), instead
            of ``texts``.
        weight: the starting w (default 0: the term is off until a controller turns it on).
        batch_size: anchor sequences per loss computation (drawn at random, with replacement).
        max_length: tokens kept per anchor text.
        top_k: reference log-probs cached per position (see the module docstring).
        seed: seed of the anchor's own batch RNG.
        reference: a frozen reference model to use instead of the model at ``setup``.
        response_template: the text that starts an answer (``general.response_template(tok)``,
            ``"<|im_start|>assistant\n"`` for SmolLM2). Given, the KL counts only the positions
            that predict a text's answer (after the template's last occurrence); the prompt before
            it is context. Texts without it (plain text) count whole. None: every position counts.
        sampling: how anchor texts are drawn. ``"uniform"`` (default): at random, with
            replacement. ``"drift"``: a share ``priority`` of the draws goes to texts already
            measured, in proportion to the KL last measured on each, so the anchor returns to
            where the model is drifting most (for a narrow task: the neighbourhood it spills
            into); the rest stay uniform, so every text keeps being tried. No extra forward: each
            text's KL comes from the anchor batches themselves.
        priority: the share of prioritised draws with ``sampling="drift"``, in [0, 1].
    """

    def __init__(self, texts: Sequence[str] | None, tokenizer: Any, *, weight: float = 0.0, batch_size: int = 4,
                 max_length: int = 64, top_k: int = 64, seed: int = 0, reference: Any = None,
                 response_template: str | None = None, sampling: str = "uniform", priority: float = 0.5,
                 token_ids: Sequence[Sequence[int]] | None = None) -> None:
        if (texts is None) == (token_ids is None):
            raise ValueError("KLAnchor: give texts or token_ids (one of them)")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if max_length < 2:
            raise ValueError(f"max_length must be >= 2, got {max_length}")
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if sampling not in ("uniform", "drift"):
            raise ValueError(f"sampling must be 'uniform' or 'drift', got {sampling!r}")
        if not 0.0 <= float(priority) <= 1.0:
            raise ValueError(f"priority must be in [0, 1], got {priority}")
        self.sampling, self.priority = sampling, float(priority)
        self.batch_size, self.max_length, self.top_k = batch_size, max_length, top_k
        self.pad_id = pad_token_id(tokenizer)
        encoded = ([[int(i) for i in ids] for ids in token_ids] if token_ids is not None
                   else encode(tokenizer, check_texts(texts, "anchor texts")))
        self._ids = [ids[:max_length] for ids in encoded]
        self._ids = [ids for ids in self._ids if len(ids) >= 2]
        if not self._ids:
            raise ValueError("anchor texts: no text has 2 tokens or more")
        # per text, the first position whose next-token prediction the KL counts
        self._starts = [0] * len(self._ids)
        if response_template is not None:
            marker = tokenizer(response_template, add_special_tokens=False)["input_ids"]
            if not marker:
                raise ValueError("response_template: encodes to no token")
            self._starts = [_answer_start(ids, marker) for ids in self._ids]
        self.response_template = response_template
        self.reference = reference
        self._rng = random.Random(seed)
        self._weight = 0.0
        self.weight = weight
        self._cache: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self.forwards = 0  # forward passes of the current model on anchor batches
        self.reference_forwards = 0  # reference passes (setup only)
        self.last_weight: float | None = None  # the w the latest loss computation used
        self.last_kl: float | None = None
        self._kl_sum, self._kl_n = 0.0, 0
        # the KL last measured on each text (None: not drawn yet); drives sampling="drift"
        self._text_kl: list[float | None] = [None] * len(self._ids)
        self.last_picks: list[int] = []  # the texts of the latest anchor batch

    # -- the knob ------------------------------------------------------------------------------
    @property
    def weight(self) -> float:
        return self._weight

    @weight.setter
    def weight(self, value: float) -> None:
        value = float(value)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"kl_weight must be a finite number >= 0, got {value}")
        self._weight = value

    @property
    def num_texts(self) -> int:
        return len(self._ids)

    @property
    def token_ids(self) -> list[list[int]]:
        """The anchor texts as the term reads them: token ids, cut to ``max_length``."""
        return [list(ids) for ids in self._ids]

    @property
    def ready(self) -> bool:
        return self._cache is not None

    # -- reference -----------------------------------------------------------------------------
    def setup(self, model: Any, *, force: bool = False) -> None:
        """Cache the reference's top-k next-token log-probs on every anchor text (once)."""
        if self._cache is not None and not force:
            return
        device = next(model.parameters()).device
        cache = []
        with probe_mode(model):
            for start in range(0, len(self._ids), self.batch_size):
                batch = self._ids[start:start + self.batch_size]
                ids, mask = pad_batch(batch, self.pad_id, side="right", device=device)
                logits = self._reference_logits(model, ids, mask)
                logp = F.log_softmax(logits.float(), dim=-1)
                top_logp, top_idx = logp.topk(min(self.top_k, logp.shape[-1]), dim=-1)
                # floored at 1e-30 (contributes nothing, keeps every value finite)
                tail = torch.log((-torch.expm1(torch.logsumexp(top_logp, dim=-1))).clamp_min(_TINY))
                for row, seq in enumerate(batch):
                    n = len(seq)
                    cache.append((top_idx[row, :n].to(torch.int32).cpu(), top_logp[row, :n].cpu(),
                                  tail[row, :n].cpu()))
                self.reference_forwards += 1
        self._cache = cache
        # FSDP2 (every rank runs this setup on the same texts): free the gathered root weights.
        reshard(model, *((self.reference,) if self.reference is not None else ()))

    def _reference_logits(self, model: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.reference is not None:
            ref_device = next(self.reference.parameters()).device
            return self.reference(input_ids=ids.to(ref_device), attention_mask=mask.to(ref_device),
                                  use_cache=False).logits.to(ids.device)
        if is_peft_model(model):
            with model.disable_adapter():
                return model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits

    # -- the term ------------------------------------------------------------------------------
    def term(self, model: Any) -> torch.Tensor:
        """``w · KL`` on one anchor batch (a tensor with grad), or a 0 tensor without any forward
        pass while w = 0. For a plain loop: ``loss = task_loss + anchor.term(model)``."""
        loss = self.loss(model)
        if loss is None:
            return torch.zeros((), device=next(model.parameters()).device)
        return loss

    def loss(self, model: Any) -> torch.Tensor | None:
        """``w · KL`` on one anchor batch, or None (and no forward) while w = 0."""
        w = self._weight  # read once: one loss, one weight
        self.last_weight = w
        if w == 0.0:
            return None
        if self._cache is None:
            raise RuntimeError("KLAnchor.setup(model) must run before training (the reference is the model "
                               "at setup); anchor_trainer() and ActuatorCallback do it at train begin")
        picks = [self._draw() for _ in range(self.batch_size)]
        self.last_picks = picks
        device = next(model.parameters()).device
        ids, mask = pad_batch([self._ids[i] for i in picks], self.pad_id, side="right", device=device)
        width = ids.shape[1]
        k = self._cache[0][0].shape[-1]
        top_idx = torch.zeros((len(picks), width, k), dtype=torch.int64)
        top_logp = torch.zeros((len(picks), width, k))
        tail = torch.full((len(picks), width), math.log(_TINY))  # padding: masked out below
        for row, i in enumerate(picks):
            idx, lp, tl = self._cache[i]
            n = idx.shape[0]
            top_idx[row, :n], top_logp[row, :n], tail[row, :n] = idx.long(), lp, tl
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        per_pos = bucket_kl(logits, top_idx.to(device), top_logp.to(device), tail.to(device))
        starts = torch.tensor([self._starts[i] for i in picks], device=mask.device)
        keep = mask.bool() & (torch.arange(width, device=mask.device)[None, :] >= starts[:, None])
        kl = per_pos[keep].mean()
        if self.sampling == "drift":  # the per-text KL only drift sampling reads: no work on the step otherwise
            with torch.no_grad():
                per_text = (per_pos * keep).sum(-1) / keep.sum(-1).clamp_min(1)
            for i, value_i in zip(picks, per_text.tolist()):
                self._text_kl[i] = max(0.0, value_i)
        self.forwards += 1
        value = float(kl.detach())
        self.last_kl = value
        self._kl_sum += value
        self._kl_n += 1
        return w * kl

    def _draw(self) -> int:
        """One text index: uniform, or (``sampling="drift"``, a ``priority`` share of draws) in
        proportion to the KL last measured on each text drawn before."""
        if self.sampling == "drift" and self._rng.random() < self.priority:
            seen = [(i, v) for i, v in enumerate(self._text_kl) if v is not None and v > 0]
            total = sum(v for _, v in seen)
            if total > 0:
                r = self._rng.random() * total
                for i, v in seen:
                    r -= v
                    if r <= 0:
                        return i
                return seen[-1][0]
        return self._rng.randrange(len(self._ids))

    def pop_metrics(self) -> dict[str, float]:
        """``anchor/kl`` (mean since the last call, when the term ran) and ``anchor/kl_weight``."""
        out = {"anchor/kl_weight": self._weight}
        if self._kl_n:
            out["anchor/kl"] = self._kl_sum / self._kl_n
        self._kl_sum, self._kl_n = 0.0, 0
        return out

    # -- checkpoint state ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"weight": self._weight, "rng": self._rng.getstate(), "cache": self._cache,
                "forwards": self.forwards, "top_k": self.top_k, "num_texts": len(self._ids),
                "text_kl": list(self._text_kl)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("num_texts") != len(self._ids) or state.get("top_k") != self.top_k:
            raise ValueError(f"anchor state is for {state.get('num_texts')} texts / top_k {state.get('top_k')}, "
                             f"this anchor has {len(self._ids)} / {self.top_k}: pass the same anchor texts")
        self.weight = state["weight"]
        self._rng.setstate(state["rng"])
        self._cache = state["cache"]
        self.forwards = int(state.get("forwards", 0))
        # states saved before drift sampling existed carry no per-text KL: start unmeasured
        self._text_kl = list(state.get("text_kl") or [None] * len(self._ids))

    def save(self, directory: str) -> str:
        path = os.path.join(directory, STATE_FILE)
        torch.save(self.state_dict(), path)
        return path

    def load(self, directory: str) -> bool:
        path = os.path.join(directory, STATE_FILE)
        if not os.path.exists(path):
            return False
        self.load_state_dict(torch.load(path, weights_only=False))
        return True


class KLAnchorKnob:
    """Knob setter ``kl_weight``: the anchor's ``w``, read by the next loss computation."""

    name = "kl_weight"

    def __init__(self, anchor: KLAnchor) -> None:
        if not isinstance(anchor, KLAnchor):
            raise KnobNotSupported(f"kl_weight: expected a KLAnchor, got {type(anchor).__name__}")
        self.anchor = anchor

    def read(self) -> float:
        return float(self.anchor.weight)

    def nominal(self) -> float:
        return self.read()

    def apply(self, value: float) -> float:
        self.anchor.weight = max(0.0, float(value))
        return self.read()


@knob_setter("kl_weight", hint="actuator.agents.anchor.KLAnchorKnob(anchor)")
def _kl_weight(*, trainer: Any, **_: Any) -> KLAnchorKnob:
    anchor = getattr(trainer, "kl_anchor", None)
    if anchor is None:
        raise ConfigError("knobs.kl_weight: the trainer has no KL anchor; build it with "
                          "actuator.agents.anchor.anchor_trainer(YourTrainer)(..., kl_anchor=KLAnchor(texts, "
                          "tokenizer)), or pass setters=[KLAnchorKnob(anchor)] for your own loop")
    return KLAnchorKnob(anchor)


try:
    from transformers import TrainerCallback
except ImportError as exc:
    from .models import training_stack_missing

    raise training_stack_missing("actuator.agents.anchor", exc) from exc


class KLAnchorCallback(TrainerCallback):
    """Builds the anchor's reference at train begin and keeps its state in checkpoints.

    On resume the reference must stay the *starting* model, not the checkpoint the trainer just
    loaded, so the cache, ``w`` and the anchor RNG are saved beside each checkpoint and loaded back.
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        # on_train_begin ran for this train() call: install_anchor may run it ahead of the trainer
        self._begun = False

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self._begun:
            return
        self._begun = True
        anchor = self.trainer.kl_anchor
        resume = getattr(self.trainer, "_anchor_resume_dir", None)
        if state.global_step and resume and anchor.load(resume):
            return
        if state.global_step and resume:
            raise RuntimeError(f"resuming from {resume}, which holds no {STATE_FILE}: the KL anchor's reference "
                               "(the starting model) cannot be rebuilt from a trained checkpoint")
        anchor.setup(model if model is not None else self.trainer.model)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._begun = False

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if os.path.isdir(path) and getattr(state, "is_world_process_zero", True):
            self.trainer.kl_anchor.save(path)


class KLAnchorMixin:
    """Put in front of any ``transformers.Trainer`` subclass (see :func:`anchor_trainer`); takes
    ``kl_anchor=KLAnchor(...)``. Adds ``w · KL`` on an anchor batch to every training loss (not to
    evaluation), scaled for gradient accumulation the way ``Trainer`` scales the task loss, and
    the ``anchor/kl`` and ``anchor/kl_weight`` values to every log."""

    kl_anchor: KLAnchor | None

    def __init__(self, *args: Any, kl_anchor: KLAnchor | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kl_anchor is not None and not isinstance(kl_anchor, KLAnchor):
            raise TypeError(f"kl_anchor must be a KLAnchor, got {type(kl_anchor).__name__}")
        self.kl_anchor = kl_anchor
        self._anchor_resume_dir: str | None = None
        if kl_anchor is not None:
            self.add_callback(KLAnchorCallback(self))  # type: ignore[attr-defined]

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint:
            if isinstance(resume_from_checkpoint, bool):
                from transformers.trainer_utils import get_last_checkpoint

                resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)  # type: ignore[attr-defined]
            self._anchor_resume_dir = resume_from_checkpoint or None
        return super().train(resume_from_checkpoint, *args, **kwargs)  # type: ignore[misc]

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        out = super().compute_loss(model, inputs, return_outputs=return_outputs,  # type: ignore[misc]
                                   num_items_in_batch=num_items_in_batch)
        anchor = self.kl_anchor
        if anchor is None or not model.training:
            return out
        term = anchor.loss(model)
        if term is None:
            return out
        if self._loss_scaled_for_ga(num_items_in_batch):
            # Trainer will not divide this loss by the accumulation steps: do it for our mean.
            term = term / max(1, int(getattr(self, "current_gradient_accumulation_steps", 1) or 1))
        if return_outputs:
            loss, outputs = out
            return loss + term, outputs
        return out + term

    def _loss_scaled_for_ga(self, num_items_in_batch: Any) -> bool:
        # The rule Trainer.training_step applies to decide whether it divides the loss itself.
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is not None:
            return bool(scaled)
        return bool((getattr(self, "model_accepts_loss_kwargs", False) and num_items_in_batch is not None)
                    or getattr(self, "compute_loss_func", None) is not None)

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        if self.kl_anchor is not None and "loss" in logs:  # training logs only, not eval's
            logs.update(self.kl_anchor.pop_metrics())
        super().log(logs, *args, **kwargs)  # type: ignore[misc]


_CLASSES: dict[type, type] = {}


def anchor_trainer(trainer_cls: type) -> type:
    """``trainer_cls`` with :class:`KLAnchorMixin` in front: ``anchor_trainer(SFTTrainer)(..., kl_anchor=a)``."""
    from transformers import Trainer

    if not (isinstance(trainer_cls, type) and issubclass(trainer_cls, Trainer)):
        raise TypeError(f"anchor_trainer needs a transformers.Trainer subclass, got {trainer_cls!r}")
    if issubclass(trainer_cls, KLAnchorMixin):
        return trainer_cls
    cls = _CLASSES.get(trainer_cls)
    if cls is None:
        cls = _CLASSES[trainer_cls] = type(f"KLAnchor{trainer_cls.__name__}", (KLAnchorMixin, trainer_cls), {})
    return cls


def install_anchor(trainer: Any, anchor: KLAnchor) -> KLAnchorCallback:
    """Put ``anchor`` on a trainer already built: what ``anchor_trainer(type(trainer))(...,
    kl_anchor=anchor)`` would have built. The instance's class becomes that anchored subclass (the
    mixin's ``compute_loss``, ``log`` and ``train`` are looked up on the class at every call, so
    they act from the next call on) and the anchor's callback is added. Before ``train()``, that is
    all; inside ``train()``'s ``on_train_begin`` the caller runs the returned callback's
    ``on_train_begin`` itself (the reference is the model at train begin)."""
    if getattr(trainer, "kl_anchor", None) is not None:
        raise ValueError("install_anchor: the trainer already has a KL anchor")
    if not isinstance(anchor, KLAnchor):
        raise TypeError(f"kl_anchor must be a KLAnchor, got {type(anchor).__name__}")
    trainer.__class__ = anchor_trainer(type(trainer))
    trainer.kl_anchor = anchor
    trainer._anchor_resume_dir = None
    callback = KLAnchorCallback(trainer)
    trainer.add_callback(callback)
    return callback


def pair_token_ids(dataset: Any, tokenizer: Any, *, limit: int = 64) -> list[list[int]]:
    """Prompt + chosen of up to ``limit`` preference pairs of ``dataset`` (evenly spaced), as token
    ids: the text a DPO run trains towards, so an anchor on it pulls back where the run moves.

    TRL's ``DPOTrainer`` keeps its tokenization in ``prompt_ids`` / ``chosen_ids``: those are used as
    they are (conversational or not, the chat template already applied). Otherwise the ``prompt``
    and ``chosen`` columns are rendered as TRL renders them: message lists through the tokenizer's
    chat template, strings concatenated; a dataset with ``chosen`` only (the prompt inside it) uses
    ``chosen``. [] when ``dataset`` holds no pairs (no ``chosen`` column, or no length)."""
    columns = set(getattr(dataset, "column_names", None) or [])
    if not columns & {"chosen", "chosen_ids"} or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return []
    rows = subsample(len(dataset), limit)
    if {"prompt_ids", "chosen_ids"} <= columns:
        return [[int(i) for i in dataset[r]["prompt_ids"]] + [int(i) for i in dataset[r]["chosen_ids"]]
                for r in rows]
    if "chosen" not in columns:
        return []
    out = []
    for r in rows:
        example = dataset[r]
        prompt, chosen = example.get("prompt"), example["chosen"]
        if isinstance(chosen, list):  # conversational: lists of {"role", "content"} messages
            text = tokenizer.apply_chat_template(list(prompt or []) + chosen, tokenize=False)
            ids = encode(tokenizer, [text], add_special_tokens=False)[0]
        else:
            ids = encode(tokenizer, [(prompt or "") + chosen])[0]
        out.append(ids)
    return out


def reading_set(model: Any, tokenizer: Any, *, n: int = 24, seed: int = 1, max_prompt_tokens: int = 192,
                max_new_tokens: int = 16, records: list[dict] | None = None) -> list[str]:
    """Reading-comprehension anchor texts: ``n`` multi-hop questions in the HotpotQA probe's own
    prompt format (its instruction, the paragraphs cut to ``max_prompt_tokens``: distractors go
    first, so the two gold paragraphs stay), each with the model's own greedy answer.

    By default the records come from a synthetic world of another ``seed`` than the probe's
    shipped set (seed 0), and any record sharing a paragraph title with the shipped set is left
    out: the anchor reads the way the probe asks, about entities the probe never shows. Pass
    ``records`` (official-format dicts) to anchor on your own reading data instead."""
    from .general import _continue, _turn_end
    from .probes._hotpotqa import build_prompt, load_hotpotqa
    from .probes._synthetic import generate_synthetic_hotpotqa

    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if records is None:
        shipped = {title for r in load_hotpotqa(None) for title, _ in r["context"]}
        size = max(n, 40)  # one pool for every n <= 40: a smaller n takes a prefix of the same records
        records = [r for r in generate_synthetic_hotpotqa(n_bridge=size, n_comparison=size, seed=seed)
                   if not {title for title, _ in r["context"]} & shipped]
    records = records[:n]
    if len(records) < n:
        raise ValueError(f"n: only {len(records)} reading records available, asked for {n}")
    prompts = [build_prompt(r, tokenizer, max_prompt_tokens=max_prompt_tokens).text for r in records]
    end = _turn_end(tokenizer)
    return [text + (answer.strip() + end if finished else answer)
            for text, (answer, finished) in zip(prompts, _continue(model, tokenizer, prompts, max_new_tokens, 4))]
