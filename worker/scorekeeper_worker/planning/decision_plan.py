"""Decision prompts (planning/decision_prompts.py) → the pack units that answer them, with the planned tokens admitted
(`--max-request-tokens`) before any unit is built.

Multi-item (several questions, `--multi-item-scoring`): the tokens every question's prompt starts with (the input,
rendered) are the context row, run once per chunk; each question's remaining tokens are an item; each option of
several tokens is a child item of its question (all its tokens but the last: engine/runner/packing.py), so it sees the
input, its question and itself, never another question or option. Otherwise every question is its own unit: its
whole prompt as the context row, its options' tokens as items. Either way every row sees exactly the tokens of the
flat sequence `prompt + option`, so the answers are the same, and the same as each question asked alone.

Rows read (engine/queue/decision_job.py): the last prompt token of each question (every option's first token), and each
token of an option item (the option's next token)."""

from __future__ import annotations

from dataclasses import dataclass

from scorekeeper_worker.base.errors import Invalid
from scorekeeper_worker.engine.queue.decision_job import QuestionOptions, RowTarget
from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.planning.decision_prompts import DecisionTokens
from scorekeeper_worker.planning.encoding import too_long
from scorekeeper_worker.planning.planner import admit, mis_chunks, rope_table
from scorekeeper_worker.planning.template_encoding import common_prefix


@dataclass
class DecisionPlan:
    units: list[PackUnit]
    targets: list[RowTarget]  # slot → what its row predicts
    prompt_tokens: int
    multi_item: bool


def questions(tokens: DecisionTokens) -> list[QuestionOptions]:
    return [QuestionOptions(tuple(tuple(option) for option in options)) for options in tokens.options]


def admit_early(input_tokens: int, question_tokens: list[int], multi_item: bool, limit: int) -> None:
    """`--max-request-tokens` on a lower bound (the input's and the questions' own tokens, without the template),
    before every question's whole prompt is rendered and tokenized: a large input times many questions is refused
    for the cost of tokenizing each once."""
    shared = input_tokens if multi_item else input_tokens * len(question_tokens)
    admit(shared + sum(question_tokens), limit, "at least: the input and every question", "questions")


def _rope_tables(model: ScoringModel, tokens: DecisionTokens, fields: list[str]) -> list[int]:
    """Each question's RoPE table (model/trunk_patches.py), after its length check. transformers picks the table of each
    flat `prompt + option` from its own length; a question whose options would take different tables (a longrope
    model, the prompt at its original maximum) is refused rather than answered from one table."""
    tables = []
    for prompt, options, field in zip(tokens.prompts, tokens.options, fields, strict=True):
        lengths = [len(prompt) + len(option) - 1 for option in options]
        if max(lengths) > model.max_positions:
            raise too_long(field, max(lengths), model.max_positions,
                           " (the input, in the decision prompt, with this question and its longest option)")
        table = rope_table(model, max(lengths))
        if rope_table(model, min(lengths)) != table:
            raise Invalid(field, f"the prompt with this question's shortest and longest options is "
                             f"{min(lengths)} and {max(lengths)} tokens, either side of the model's "
                             f"{model.rope.long_after}-token RoPE threshold (longrope); give options of one length "
                             "or a shorter input")
        tables.append(table)
    return tables


def _add_question(unit: PackUnit, question: int, tail: list[int], options: list[list[int]],
                  targets: list[RowTarget]) -> None:
    """A question's rows in `unit`: its prompt tokens after the context (none when the context is its whole prompt),
    then its options of several tokens (children of the question's item, or plain items after a whole prompt)."""
    parent = -1
    if tail:
        unit.items.append(tail)
        unit.parents.append(-1)
        parent = len(unit.items) - 1
    end = unit.num_tokens - 1  # the question's last prompt token
    unit.pools.append(Pool(range(end, end + 1), len(targets)))
    targets.append(RowTarget(question))
    for k, option in enumerate(options):
        if len(option) == 1:
            continue
        start = unit.num_tokens
        unit.items.append(option[:-1])
        unit.parents.append(parent)
        for j in range(len(option) - 1):
            unit.pools.append(Pool(range(start + j, start + j + 1), len(targets)))
            targets.append(RowTarget(question, k, j + 1))


def plan(model: ScoringModel, tokens: DecisionTokens, fields: list[str], multi_item: bool, max_batch_tokens: int,
         max_request_tokens: int | None) -> DecisionPlan:
    """The units of one request, each pool keyed by its slot: the index of its row's target."""
    tables = _rope_tables(model, tokens, fields)
    prompts = tokens.prompts
    extra = [sum(len(option) - 1 for option in options) for options in tokens.options]  # option rows per question
    shared = 0
    if multi_item and len(prompts) > 1:  # every question keeps a token of its own, the row its answer is read at
        shared = min(common_prefix(prompts[0], prompts[1:]), min(len(prompt) for prompt in prompts) - 1)
    sizes = [len(prompt) - shared + rows for prompt, rows in zip(prompts, extra, strict=True)]
    if shared:  # questions of one RoPE table per chunk (the context row is computed with its items' table)
        groups: dict[int, list[int]] = {}
        for q, table in enumerate(tables):
            groups.setdefault(table, []).append(q)
        chunks = [[group[k] for k in chunk] for group in groups.values()
                  for chunk in mis_chunks(shared, [sizes[q] for q in group], max_batch_tokens)]
    else:
        chunks = [[q] for q in range(len(sizes))]
    planned = len(chunks) * shared + sum(sizes)
    how = f"the input once in each of {len(chunks)} multi-item chunks" if shared else "the input once per question"
    admit(planned, max_request_tokens, how, "questions")
    units: list[PackUnit] = []
    targets: list[RowTarget] = []
    for chunk in chunks:
        context = prompts[chunk[0]][:shared] if shared else prompts[chunk[0]]
        unit = PackUnit(list(context), visible_prefix=len(context), position_start=model.position_start,
                        rope_table=tables[chunk[0]])
        for q in chunk:
            _add_question(unit, q, prompts[q][shared:] if shared else [], tokens.options[q], targets)
        units.append(unit)
    return DecisionPlan(units, targets, planned, bool(shared))
