"""A report page's text as a reader sees it, and the numbers in it shown with more digits than they can mean."""

from __future__ import annotations

import re
from html.parser import HTMLParser

# Elements with no end tag.
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
# A number standing alone (not part of a word, a hash, a version or a dotted path): sign, digits with thousands
# separators, decimals, exponent.
NUMBER = re.compile(r"(?<![\w.,])-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")
MAX_DIGITS = 6


class _Text(HTMLParser):
    def __init__(self, skip_exact: bool):
        super().__init__(convert_charrefs=True)
        self.skip_exact, self.stack, self.parts = skip_exact, [], []

    def handle_starttag(self, tag, attrs):
        if tag not in VOID:
            classes = (dict(attrs).get("class") or "").split()
            self.stack.append(tag in ("style", "script", "title") or (self.skip_exact and "exact" in classes))

    def handle_endtag(self, tag):
        if tag not in VOID and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if not any(self.stack):
            self.parts.append(data)


def visible_text(html: str, *, skip_exact: bool = False) -> str:
    """The page's text (collapsed details included), without what is marked exact when `skip_exact`: the values
    shown as recorded (sha256, commits, versions, thresholds, config echoes)."""
    parser = _Text(skip_exact)
    parser.feed(html)
    return " ".join(" ".join(parser.parts).split())


def too_precise(text: str) -> list[str]:
    """Numbers in `text` with more than MAX_DIGITS significant digits, and counts of five digits or more
    without thousands separators."""
    found = []
    for match in NUMBER.finditer(text):
        token = match.group().lstrip("-")
        mantissa = re.split(r"e", token)[0]
        if "." not in mantissa and "e" not in token:
            if len(mantissa) >= 5 and "," not in mantissa:
                found.append(token)
            continue
        if len(mantissa.replace(",", "").replace(".", "").lstrip("0")) > MAX_DIGITS:
            found.append(token)
    return found


# The first screen of a report (or preflight) page as the browser lays it out: the verdict, and per row of the
# decision table its stage (the link's target), status, deciding figure and where its bottom edge is.
FIRST_SCREEN = """(() => {
  const box = element => element.getBoundingClientRect();
  const verdict = document.querySelector('.verdict');
  return {
    verdict: verdict.querySelector('.status').innerText.trim(), verdict_bottom: box(verdict).bottom,
    rows: [...document.querySelectorAll('table.decision tr')].slice(1).map(row => ({
      stage: row.querySelector('a').getAttribute('href').slice(1), status: row.cells[1].innerText.trim(),
      figure: row.cells[2].innerText.trim(), bottom: box(row).bottom})),
    viewport: window.innerHeight, height: document.documentElement.scrollHeight,
  };
})()"""

# Whether the page scrolls sideways: its scrollWidth against its clientWidth.
WIDTHS = "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
OPEN_ALL = ("document.querySelectorAll('details').forEach(d => d.open = true); "
            "document.querySelectorAll('details').length")

# Per link of the decision table: whether the details holding its target were closed before the click and are
# open after it (each closed again before the next).
OPENED_BY_LINK = """[...document.querySelectorAll('table.decision a')].map(link => {
  const details = document.getElementById(link.getAttribute('href').slice(1)).closest('details');
  const before = details.open;
  link.click();
  const after = details.open;
  details.open = false;
  return [link.getAttribute('href').slice(1), before, after];
})"""


def words_in_order(wanted: str, text: str) -> bool:
    """Whether the words of `wanted` occur in `text` in their order, other text between them allowed: how a PDF's
    extracted text holds a table cell that wrapped (its lines interleave with the other columns' lines). Spaces
    and hyphens are dropped on both sides first: pdftotext joins a word broken at a hyphen, and may drop or add
    a space where a line wraps ("MFU 2 %" comes back as "MFU\n2%")."""
    squeezed = "".join(text.replace("-", "").split())
    position = 0
    for word in wanted.replace("-", "").split():
        found = squeezed.find(word, position)
        if found < 0:
            return False
        position = found + len(word)
    return True
