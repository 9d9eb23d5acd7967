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

from scorekeeper_worker.engine.queue.jobs import Pending
from scorekeeper_worker.engine.runner.heads import LabelProbs, NextTokenLogProb, RowHead, RowResult


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

    def head(self, slot: int) -> RowHead:
        """A question's last prompt token: the log of the softmax over its options' first tokens (the first term up to
        a constant per question); an option's later token: its log-probability over the vocabulary."""
        target = self.targets[slot]
        options = self.questions[target.question].options
        if target.option < 0:
            return RowHead(LabelProbs(tuple(option[0] for option in options), True, 1.0, log=True))
        return RowHead(NextTokenLogProb(options[target.option][target.token]))

    def absorb(self, slots: list[int], rows: list[RowResult]) -> None:
        """Take this job's rows of one batch: each row's term of its question's option log-probabilities."""
        for slot, row in zip(slots, rows, strict=True):
            target = self.targets[slot]
            if target.option < 0:
                self.first[slot] = (target.question, row.scores)
            else:
                self.later[slot] = row.scores[0]
        self.remaining -= len(slots)

    def probabilities(self) -> list[list[float]]:
        """Per question, the options' probabilities (from every row absorbed so far)."""
        return [_softmax(totals) for totals in self.totals]

    def result(self) -> DecisionResult:
        return DecisionResult(probabilities=self.probabilities(), prompt_tokens=self.prompt_tokens,
                              multi_item=self.multi_item, queue_seconds=self.queue_seconds)
