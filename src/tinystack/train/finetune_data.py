"""Fine-tuning data: conversations JSONL -> validated, rendered, deduplicated, split by source.

    one JSON object per line, either
        {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...], "source"?, "id"?}
        {"prompt": str, "completion": str, "system"?: str, "source"?, "id"?}   (= one user + one assistant turn)
    as OpenAI's fine-tuning files have them: content may be a list of {"type": "text", "text": str} parts
    (joined, as the server joins them), and an assistant message may carry "weight": 0 (shown to the model
    as context, never a target) or 1 (the default)
      -> read        data.io.readers.jsonl_objects; a line that is not JSON, not an object, has no
                     assistant turn, a bad role or content, or that the chat template rejects goes to
                     `Rejects` with its file and line number (reasons below); the rest carries on
      -> render      the whole conversation in the built-in role format ("user: ...\\nassistant: ...\\n"):
                     the record's text, what dedup compares. Not the model's template: its boilerplate
                     (SmolLM2 adds a 90-character default system prompt) would make every short
                     conversation a near duplicate of every other. The template must still render
                     it (the tokens come from the template, finetune_batches), or the line is rejected
      -> dedup       data.NearDedup (exact + MinHash near duplicates over that text, [data] dedup
                     settings), or data.ExactDedup when data.near_dedup is off
      -> split       data.Splitter by the `source` field: every conversation of a source lands in
                     one split, so held-out loss measures unseen sources (never a random split)

Reject reasons: invalid_utf8, invalid_json, invalid_unicode, not_object, bad_messages,
no_assistant, bad_source, template_error. A record without `source` gets the file's name.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tinystack.config import DataConfig
from tinystack.data.dedup.exact import ExactDedup
from tinystack.data.dedup.near_step import NearDedup
from tinystack.data.io.readers import jsonl_objects
from tinystack.data.io.records import Record
from tinystack.data.io.rejects import Rejects
from tinystack.data.options import near_dup_params
from tinystack.data.split.splitter import Splitter
from tinystack.data.steps import StepStats
from tinystack.infer.chat import ChatFormatter, ChatTemplateError

ROLES = ("system", "user", "assistant")


class ConversationError(ValueError):
    """A JSON object is not a usable conversation; `reason` is the reject code."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def conversation_messages(obj: Any) -> list[dict[str, str]]:
    """The messages of one JSONL object (either schema); raises ConversationError."""
    if not isinstance(obj, dict):
        raise ConversationError("not_object", f"expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ConversationError("bad_messages", "'messages' must be a non-empty list")
    elif "prompt" in obj and "completion" in obj:
        msgs = [{"role": "user", "content": obj["prompt"]}, {"role": "assistant", "content": obj["completion"]}]
        if "system" in obj:
            msgs.insert(0, {"role": "system", "content": obj["system"]})
    else:
        raise ConversationError("bad_messages", "expected 'messages', or 'prompt' and 'completion'")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ConversationError("bad_messages", f"message {i}: needs a role in {ROLES}")
        msg = {"role": m["role"], "content": _content_text(m.get("content"), i)}
        if "weight" in m:
            w = m["weight"]
            if m["role"] != "assistant" or isinstance(w, bool) or w not in (0, 1):
                raise ConversationError("bad_messages", f"message {i}: weight must be 0 or 1, and only on an "
                                                        f"assistant message (got {w!r} on {m['role']})")
            if w == 0:
                msg["weight"] = 0
        out.append(msg)
    if not any(is_target(m) and m["content"].strip() for m in out):
        raise ConversationError("no_assistant", "no non-empty assistant message to learn from (weight 1)")
    return out


def is_target(message: dict[str, Any]) -> bool:
    """An assistant turn the model learns (not one with weight 0)."""
    return message["role"] == "assistant" and message.get("weight", 1) != 0


def _content_text(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ConversationError("bad_messages", f"message {i}: content must be a string or a list of "
                                            '{"type": "text", "text": ...} parts')


ROLE_FORMAT = ChatFormatter(None)  # the built-in format, the same for every model


def read_conversations(path: str | Path, formatter: ChatFormatter, rejects: Rejects) -> Iterator[Record]:
    """Records whose text is the conversation in the role format and whose extra["messages"] are its
    messages; lines `formatter` (the model's template) cannot render are rejected as template_error."""
    path = Path(path)
    for lineno, line, obj in jsonl_objects(path, rejects):
        try:
            messages = conversation_messages(obj)
            source = obj.get("source") if obj.get("source") is not None else path.name
            if not isinstance(source, str) or not source:
                raise ConversationError("bad_source", f"source must be a non-empty string, got {source!r}")
            formatter.render(messages, add_generation_prompt=False)
            text = ROLE_FORMAT.render(messages, add_generation_prompt=False)
        except ConversationError as e:
            rejects.add(path, lineno, e.reason, line, str(e))
            continue
        except ChatTemplateError as e:
            rejects.add(path, lineno, "template_error", line, str(e))
            continue
        rid = obj.get("id")
        yield Record(text=text, source=source, id=rid if isinstance(rid, (str, int)) else None,
                     extra={"messages": messages}, origin=(str(path), lineno))


@dataclass
class PreparedConversations:
    train: list[Record]
    val: list[Record]
    steps: list[StepStats] = field(default_factory=list)

    def dropped(self) -> Counter[str]:
        """Conversations the steps removed (duplicates, ...), by reason; rejected lines are counted apart."""
        return sum((s.dropped for s in self.steps), Counter())

    def summary(self, rejects: Rejects) -> dict[str, Any]:
        return {"train": len(self.train), "val": len(self.val), "rejected": dict(rejects.counts),
                "steps": [s.to_dict() for s in self.steps]}


def prepare_conversations(path: str | Path, formatter: ChatFormatter, data: DataConfig,
                          rejects: Rejects) -> PreparedConversations:
    """Read, dedup and split (by source: data.val_fraction held out) a conversations file; bad lines land in
    `rejects`."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no such conversations file: {path}")
    stream: Any = read_conversations(path, formatter, rejects)
    dedup: Any = NearDedup(near_dup_params(data), exact=True, workers=data.workers) if data.near_dedup \
        else ExactDedup()
    splitter = Splitter("source", val_fraction=data.val_fraction, test_fraction=0.0, rejects=rejects)
    splits = splitter(dedup(stream))
    for stats in (dedup.stats, splitter.stats):
        stats.check()
    if not splits["train"]:
        raise ValueError(f"{path}: no usable conversation for training ({rejects.total} rejected lines)")
    return PreparedConversations(splits["train"], splits["val"], [dedup.stats, splitter.stats])
