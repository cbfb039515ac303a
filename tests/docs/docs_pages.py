"""Reading the docs' pages: their fenced blocks, the marks that say how a test checks each, and shapes.

A block is marked by an HTML comment on the line before its fence (invisible on the page):

- ``<!-- check: run -->``: a ``console`` block's ``$`` commands are run in order, in one broker home
  per page, and what each prints must have the shape shown; a ``python`` block is executed and,
  when the next block is marked ``<!-- check: printed -->``, must print that block's shape.
- ``<!-- check: tested: PATH, ... -->``: run by the tests named (a long-running service, the whole
  suite), which must exist.
- ``<!-- check: skip: REASON -->``: shown, not run (a cloud account, a long-running service, the
  shared traces at full size); the reason says why.
- ``<!-- check: printed -->``: the output of the ``python`` block before it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = re.compile(r"^<!-- check: (run|printed|tested: .+?|skip: .+?) -->$")
FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w+-]*)")
ELLIPSIS = {"...", "…"}
EXAMPLE_PATH = re.compile(r"(?<![\w/.-])examples/[\w./-]*[\w]")


def pages() -> list[Path]:
    """The README and every page of the docs site, new pages included."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str | None  # "run", "printed", "tested: ...", "skip: ...", or None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, ticks, lang = opening.groups()
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark_match = MARK.match(previous)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        found.append(Block(page, i + 1, lang, "\n".join(body), mark_match.group(1) if mark_match else None))
        i = j + 1
    return found


def marks_outside_blocks(page: Path) -> list[str]:
    """``<!-- check: ... -->`` comments that mark no block (a typo, or a fence moved away)."""
    lines = page.read_text().splitlines()
    bad = []
    for n, line in enumerate(lines):
        if line.strip().startswith("<!-- check"):
            after = next((x for x in lines[n + 1:] if x.strip()), "")
            if not MARK.match(line.strip()) or not FENCE.match(after):
                bad.append(f"{page.relative_to(ROOT)}:{n + 1}: {line.strip()}")
    return bad


@dataclass(frozen=True)
class Command:
    line: str  # the command after "$ ", continuation lines joined
    shown: list[str]  # what the page shows it printing


def commands(block: Block) -> list[Command]:
    """The ``$`` commands of a console block with the output shown under each."""
    out: list[Command] = []
    current: list[str] | None = None
    continued = False
    for line in block.text.splitlines():
        if continued and current is not None:
            out[-1] = Command(out[-1].line + " " + line.strip().rstrip("\\").strip(), out[-1].shown)
            continued = line.rstrip().endswith("\\")
            continue
        if line.startswith("$ "):
            command = line[2:].rstrip()
            continued = command.endswith("\\")
            current = []
            out.append(Command(command.rstrip("\\").strip(), current))
        elif current is not None:
            current.append(line)
    return out


def shown_commands(block: Block) -> int:
    """How many commands a block shows a reader: ``$`` lines, a shell block's lines, a Python snippet."""
    if block.lang in ("console", "") and "$ " in block.text:
        return len(commands(block))
    if block.lang in ("bash", "sh", "shell"):
        count, continued = 0, False
        for line in block.text.splitlines():
            if line.strip() and not line.strip().startswith("#") and not continued:
                count += 1
            continued = line.rstrip().endswith("\\")
        return count
    if block.lang == "python":
        return 1
    return 0


_ID = re.compile(r"\b(?:j|p|tok)-[0-9a-f]{8}\b")
_NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
_RULE = re.compile(r"([─━═┈╌-])\1+")
_PADDING = re.compile(r"\s+")


def shape(line: str) -> str:
    """A line with what changes from run to run taken out: ids, numbers, widths of columns and rules."""
    line = _ID.sub("ID", line)
    line = _NUMBER.sub("N", line)
    line = _RULE.sub(r"\1", line)
    return _PADDING.sub(" ", line).strip()


def ids(text: str) -> list[str]:
    seen: list[str] = []
    for found in _ID.findall(text):
        if found not in seen:
            seen.append(found)
    return seen


def _line_pattern(line: str) -> re.Pattern[str]:
    """A shaped line as a pattern: ``...`` or ``…`` inside it stands for any text."""
    return re.compile(".*".join(re.escape(part) for part in re.split(r"\.\.\.|…", line)))


def shape_mismatch(shown: list[str], printed: str) -> str | None:
    """None when what was printed has the shape shown; else what differs.

    Each line shown must appear in the output, in order; a line of ``...`` or ``…`` alone stands for
    any lines, and inside a line for any text. Where the page shows no such line, the output has no
    other lines either.
    """
    wanted = [shape(line) for line in shown if line.strip()]
    got = [shape(line) for line in printed.splitlines() if line.strip()]
    elided = any(w in ELLIPSIS for w in wanted)
    patterns = [_line_pattern(w) for w in wanted if w not in ELLIPSIS]
    position = 0
    for pattern in patterns:
        position = next((i + 1 for i in range(position, len(got)) if pattern.fullmatch(got[i])), -1)
        if position < 0:
            return f"line not printed: {pattern.pattern!r}\nprinted:\n" + "\n".join(got[:60])
    if not elided and len(got) != len(patterns):
        return f"printed {len(got)} line(s), the page shows {len(patterns)}:\n" + "\n".join(got[:60])
    return None
