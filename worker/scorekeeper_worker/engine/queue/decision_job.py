"""A decision job: the questions of one /v1/decisions (or /v1/systemone) request, answered from the pooled rows of
its batches.

A question is a set of options, each a token sequence (the text the model would answer with). The question's last
prompt token predicts every option's first token; an option of several tokens adds one row per further token: its
own tokens, packed as a child item of the question (engine/runner/packing.py), each predicting the next. The answer
is the masked sequence log-probability of each option, normalised over the options:

    P(option k) = softmax_k( log p(o_k1 | prompt) + Σ_j≥2 log p(o_kj | prompt, o_k<j) )

computed on gathered rows only. The first term needs the options' rows of the output layer alone: its normaliser
over the vocabulary is the same for every option of a question and cancels (so a question whose options are all one
token costs one row against its label rows). Each further term is a log-softmax over the full vocabulary."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from scorekeeper_worker.engine.queue.jobs import Pending
from scorekeeper_worker.engine.runner import forward
from scorekeeper_worker.engine.runner.device_copy import CopyStats
from scorekeeper_worker.model.loader import ScoringModel


@dataclass(frozen=True)
class QuestionOptions:
    """A question as the engine sees it: the token ids of each option's answer text (each at least one token)."""

    options: tuple[tuple[int, ...], ...]

    @property
    def single_token(self) -> bool:
        return all(len(option) == 1 for option in self.options)


@dataclass(frozen=True)
class RowTarget:
    """What one pooled row of a decision job predicts: with `option` -1, the question's last prompt token (every
    option's first token); else token `token` (≥ 1) of that option."""

    question: int
    option: int = -1
    token: int = 0


@dataclass
class DecisionResult:
    probabilities: list[list[float]]  # per question, per option (in the question's order); each sums to 1
    prompt_tokens: int
    multi_item: bool
    queue_seconds: float


def best(probabilities: list[float]) -> int:
    """The most probable option (the first on a tie)."""
    return probabilities.index(max(probabilities))


def confidence(probabilities: list[float]) -> float:
    """How far the top probability sits above uniform: (K·max − 1) / (K − 1) for K options; 0 when every option is
    equally likely, 1 when one holds all the probability (TypeSafe's definition)."""
    k = len(probabilities)
    return min(1.0, max(0.0, (k * max(probabilities) - 1) / (k - 1)))


def token_log_probs(model: ScoringModel, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(targets[i] | row i) [n] in float32: a log-softmax over the full vocabulary (after Gemma2's final
    softcapping), a chunk of rows at a time so memory does not grow with the rows of a job."""
    head = model.model.get_output_embeddings()
    step = max(1, forward.NORMALISER_ELEMENTS // model.logit_size)
    out = []
    for i in range(0, rows.shape[0], step):
        logits = forward._softcap(model, head(rows[i:i + step]).float())
        out.append(torch.log_softmax(logits, dim=-1).gather(1, targets[i:i + step, None])[:, 0])
    return torch.cat(out)


def _softmax(totals: list[float]) -> list[float]:
    top = max(totals)
    weights = [math.exp(total - top) for total in totals]
    scale = math.fsum(weights)
    return [weight / scale for weight in weights]


@dataclass(kw_only=True)
class DecisionJob(Pending[DecisionResult]):
    """The questions of one request and what each pooled row of its plan predicts (`targets`, by slot)."""

    questions: list[QuestionOptions]
    targets: list[RowTarget]
    # What each absorbed row contributed, by slot: written, never added to, so that a batch retried after a failure
    # (engine/queue/isolation.py) absorbs the same rows again without counting them twice.
    first: dict[int, tuple[int, list[float]]] = field(default_factory=dict)  # slot → (question, per-option term)
    later: dict[int, float] = field(default_factory=dict)  # slot → log p of its option's token

    @property
    def totals(self) -> list[list[float]]:
        """Per question, per option: the log-probability from every row absorbed so far."""
        totals = [[0.0] * len(question.options) for question in self.questions]
        for question, row in self.first.values():
            totals[question] = [total + value for total, value in zip(totals[question], row, strict=True)]
        for slot, value in self.later.items():
            target = self.targets[slot]
            totals[target.question][target.option] += value
        return totals

    def absorb(self, model: ScoringModel, slots: list[int], rows: torch.Tensor, copies: CopyStats) -> None:
        """Take this job's rows of one batch: each row's term of its question's option log-probabilities."""
        features = forward.pre_head(model, rows.to(model.dtype))
        targets = [self.targets[slot] for slot in slots]
        ends: dict[int, list[int]] = {}  # question rows, grouped by their number of options
        for at, target in enumerate(targets):
            if target.option < 0:
                ends.setdefault(len(self.questions[target.question].options), []).append(at)
        for positions in ends.values():
            questions = [targets[at].question for at in positions]
            labels = torch.tensor([[option[0] for option in self.questions[q].options] for q in questions],
                                  device=features.device)
            # log of the softmax over the first tokens: the first term up to a constant per question
            first = forward.causal_lm_scores(model, features[positions], labels, True, 1.0)
            for at, q, row in zip(positions, questions, first.log().tolist(), strict=True):
                self.first[slots[at]] = (q, row)
        later = [at for at, target in enumerate(targets) if target.option >= 0]
        if later:
            tokens = torch.tensor([self.questions[targets[at].question].options[targets[at].option][targets[at].token]
                                   for at in later], device=features.device)
            for at, value in zip(later, token_log_probs(model, features[later], tokens).tolist(), strict=True):
                self.later[slots[at]] = value
        self.remaining -= len(slots)

    def probabilities(self) -> list[list[float]]:
        """Per question, the options' probabilities (from every row absorbed so far)."""
        return [_softmax(totals) for totals in self.totals]

    def result(self) -> DecisionResult:
        return DecisionResult(probabilities=self.probabilities(), prompt_tokens=self.prompt_tokens,
                              multi_item=self.multi_item, queue_seconds=self.queue_seconds)
