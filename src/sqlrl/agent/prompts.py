"""What the policy sees (prompt building) and how its replies are read (the Parser).

Everything here is a pure function of the *public* task and the policy's own outputs and the
sandbox's observations: nothing can reach the gold SQL, because a `PublicTask` holds none.

Action protocol (stated to the model in the system prompt):
- single-turn: the reply's SQL (last ```sql block, else last ``` block, else a bare statement
  starting with SELECT/WITH) is the final answer;
- multi-turn: a reply with SQL and without the word FINAL is an `inspect`: the SQL is executed and
  the result (or structured error) comes back as the next user message. A reply containing FINAL
  (upper case, as a word) is `final`: its SQL, or if it has none the last inspected SQL, is the
  answer. On the last allowed turn any SQL is final. A reply with neither SQL nor FINAL is
  `invalid` and costs a turn.
- checker (`agent.checker`): after the answer, one more user message shows the answer's execution
  result (`checker_message`); a reply with FINAL and SQL replaces the answer, any other reply keeps
  it (`sqlrl.agent.loop`).

Token-level contract: the first prompt is rendered with the tokenizer's chat template; every later
piece (end of the assistant turn, observation, next assistant header) is rendered as the *delta* of
the chat template and tokenized alone, then appended to the generated token ids as they were
produced. Generated text is never re-tokenized.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from sqlrl.agent.schemaview import schema_for_prompt, truncate_schema
from sqlrl.tasks.bird import add_column_descriptions

SYSTEM_SINGLE = (
    "You are an expert in SQLite. Given a database schema and a question, write one SQLite query "
    "that answers the question. Reply with the query in a ```sql code block and nothing else."
)

SYSTEM_MULTI = (
    "You are an expert in SQLite working with a live, read-only database. Given a database schema and a "
    "question, write a SQLite query in a ```sql code block. It will be executed and you will see its result "
    "or its error, so you can check and correct it. When the query answers the question, reply with the word "
    "FINAL followed by the final query in a ```sql code block. You have {turns} turns; on the last turn your "
    "query is final."
)

PLACEHOLDER = "\x00SQLRL_ASSISTANT_PLACEHOLDER\x00"


def user_message(question: str, schema: str, evidence: str, max_schema_chars: int | None) -> str:
    """The first user message; `schema` is truncated with `truncate_schema` unless `max_schema_chars` is
    None (the schema text is then already what the prompt shows)."""
    shown = schema.strip() if max_schema_chars is None else truncate_schema(schema.strip(), max_schema_chars)
    text = f"Database schema:\n{shown}\n\n"
    if evidence:
        text += f"Evidence: {evidence.strip()}\n\n"
    text += f"Question: {question.strip()}"
    return text


def prompt_options(budgets) -> dict:
    """The `build_messages` keywords a run's `Budgets` set (everything but `turns`)."""
    return {
        "max_schema_chars": budgets.max_schema_chars,
        "schema_sample_values": budgets.schema_sample_values,
        "schema_order": budgets.schema_order,
        "show_evidence": budgets.show_evidence,
        "column_descriptions": budgets.column_descriptions,
    }


def build_messages(
    task,
    *,
    turns: int,
    max_schema_chars: int,
    schema_sample_values: int = 0,
    schema_order: str = "file",
    show_evidence: bool = True,
    column_descriptions: bool = False,
) -> list[dict]:
    """The chat messages of the first prompt for a public task. `schema_sample_values` and `schema_order`
    are `agent.schema_sample_values` / `agent.schema_order` (`sqlrl.agent.schemaview`); off by default.
    `show_evidence` (`agent.show_evidence`): the task's evidence (BIRD's hint; empty for Spider) goes in
    an `Evidence:` line before the question. `column_descriptions` (`agent.column_descriptions`): BIRD's
    `database_description/*.csv` text after each CREATE TABLE (`sqlrl.tasks.bird.add_column_descriptions`),
    before truncation; it needs `schema_order = "file"` and no sample values."""
    system = SYSTEM_SINGLE if turns == 1 else SYSTEM_MULTI.format(turns=turns)
    if column_descriptions:
        if schema_sample_values or schema_order != "file":
            raise ValueError(
                "column_descriptions needs schema_order = 'file' and schema_sample_values = 0; "
                "turn one of them off"
            )
        task = dataclasses.replace(task, schema=add_column_descriptions(task.schema, task.db_path))
    schema = schema_for_prompt(task, max_schema_chars, schema_sample_values, schema_order)
    evidence = task.evidence if show_evidence else ""
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": user_message(task.question, schema, evidence, None)},
    ]


def observation_message(result_text: str, turn: int, turns: int) -> str:
    left = turns - turn
    tail = (
        "This is your last turn: reply with FINAL and the final query."
        if left == 1
        else "If it answers the question reply FINAL with the query; otherwise write a corrected query."
    )
    return f"Execution result:\n{result_text}\n\n{tail}"


CHECKER_INSTRUCTION = (
    "Check it before it is scored. If it answers the question, reply FINAL with the same query in a ```sql "
    "code block; otherwise reply FINAL with a corrected query in a ```sql code block. This reply ends the task."
)


def checker_message(result_text: str) -> str:
    """The checker turn's user message (`agent.checker`): the answer's own execution result (or structured
    error) and the fixed instruction; nothing else (never the gold). The SQL is not repeated: it is in the
    conversation already, and a repeated prediction equal to its gold would trip the leakage audit's
    static check (no gold string in any prompt or observation)."""
    return f"Your final query returned:\n{result_text}\n\n{CHECKER_INSTRUCTION}"


INVALID_MESSAGE = (
    "No SQL found. Write a query in a ```sql code block, or reply FINAL to keep your last query."
)


class ChatFormat:
    """Renders prompts and observation deltas as token ids with a tokenizer's chat template."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                "the tokenizer has no chat template; sqlrl needs an instruct/chat model "
                "(e.g. qwen2.5-coder-0.5b-instruct) or a tokenizer with `chat_template` set"
            )
        self._eos_texts = set()
        for tid in eos_ids(tokenizer):
            self._eos_texts.add(tokenizer.decode([tid]))

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    def observation_ids(
        self, messages: list[dict], observation: str, completion_ended_with_eos: bool
    ) -> list[int]:
        """Token ids to append after a completion: end of the assistant turn, the observation as a user
        message, and the next assistant header. `messages` are the messages before the completion."""
        full = self.render(
            messages
            + [{"role": "assistant", "content": PLACEHOLDER}, {"role": "user", "content": observation}],
            add_generation_prompt=True,
        )
        idx = full.index(PLACEHOLDER) + len(PLACEHOLDER)
        delta = full[idx:]
        if completion_ended_with_eos:
            for eos in sorted(self._eos_texts, key=len, reverse=True):
                if eos and delta.startswith(eos):
                    delta = delta[len(eos) :]
                    break
        return self.encode(delta)


def eos_ids(tokenizer) -> list[int]:
    """The tokenizer's end-of-turn token ids: its eos token, then the known chat end markers it has."""
    ids = []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    for name in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(name) if name in tokenizer.get_vocab() else None
        if tid is not None and tid not in ids:
            ids.append(tid)
    return ids


@dataclass(frozen=True)
class Action:
    kind: str  # "inspect" | "final" | "invalid"
    sql: str | None


_FENCE_SQL = re.compile(r"```\s*sql\s*\n?(.*?)(?:```|$)", re.S | re.I)
_FENCE_ANY = re.compile(r"```[a-zA-Z]*\s*\n?(.*?)(?:```|$)", re.S)
_BARE = re.compile(r"(?ims)^\s*((?:select|with)\s.*)")
_FINAL = re.compile(r"\bFINAL\b")


class Parser:
    """Reads the policy's reply into an `Action`. Deterministic and total: never raises."""

    @staticmethod
    def extract_sql(text: str) -> str | None:
        blocks = [b.strip() for b in _FENCE_SQL.findall(text) if b.strip()]
        if not blocks:
            blocks = [b.strip() for b in _FENCE_ANY.findall(text) if b.strip()]
        if blocks:
            sql = blocks[-1]
        else:
            m = _BARE.search(text)
            if not m:
                return None
            sql = m.group(1).strip()
        sql = sql.strip().rstrip(";").strip()
        return sql or None

    @classmethod
    def parse(cls, text: str, *, multi_turn: bool) -> Action:
        sql = cls.extract_sql(text)
        if not multi_turn:
            return Action("final", sql)
        if _FINAL.search(text):
            return Action("final", sql)
        if sql:
            return Action("inspect", sql)
        return Action("invalid", None)
