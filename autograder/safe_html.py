"""A graded notebook holds no script of the student's when a browser renders it.

Formgrader (the instructor's grading page, served by the instructor's own Jupyter server) and the
feedback pages render the autograded notebook as HTML with its outputs and markdown cells as they
are: nbconvert's default. A student's `display(HTML('<img src=x onerror=...>'))`, or a markdown cell
of their own, would then run script in the instructor's page with the instructor's session (start a
kernel there, rewrite the gradebook). nbconvert's `sanitize_html` is no answer: it escapes the
course's own headings and hints into visible tags, and formgrader's template renders markdown cells
without it. So the autograded notebook itself is made safe, as the last autograde step (its grades
are decided by then), before anything renders it:
- a markdown or raw cell that is not one of the course's own (its source, exactly) is shown as text:
  a fenced block, longer than any run of backticks in it;
- outputs keep text (streams, plain text, tracebacks), PNG and JPEG images whose data is base64 and that
  declare at most MAX_IMAGE_PIXELS (a PNG that claims 16,000 × 16,000 pixels is a decompression bomb for
  the browser that opens the page: it is replaced by a line that says so), and
  HTML cleaned to an allowlist of tags and attributes (text, tables, lists, links to http(s) and
  mailto); every other representation (JavaScript, SVG, markdown, LaTeX, widgets) goes, and so does
  the outputs' metadata (nbconvert writes an image's width and height into unquoted attributes);
- a cell's metadata keeps only the nbgrader part (restored from the source by `grading.sanitize`) and
  tags that are plain names; the notebook's metadata keeps only the kernel and the language.
"""
import functools
import re

import bleach
from nbformat.v4 import new_markdown_cell
from nbgrader.preprocessors import NbGraderPreprocessor

from autograder import grading, releases

TAGS = {"a", "abbr", "b", "blockquote", "br", "caption", "code", "dd", "div", "dl", "dt", "em", "h1", "h2",
        "h3", "h4", "h5", "h6", "hr", "i", "li", "ol", "p", "pre", "s", "small", "span", "strong", "sub",
        "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul"}
PROTOCOLS = {"http", "https", "mailto"}
SAFE_LINK = re.compile(r"(https?://|mailto:|#)", re.IGNORECASE)  # bleach's own check lets "javascript:1" by
IMAGES = ("image/png", "image/jpeg")
BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
PLAIN_TAG = re.compile(r"[A-Za-z0-9_-]+")
NOTEBOOK_METADATA = ("kernelspec", "language_info", "autograder")  # the last: the guard's findings (execute.py)
MAX_IMAGE_PIXELS = 4096 * 4096     # a matplotlib figure of the course is about 1,000 × 600


def image_size(mime, data):
    """(width, height) an image declares in its header, or None where it declares none that can be read."""
    import base64
    import binascii
    import struct
    try:
        raw = base64.b64decode(data if mime == "image/jpeg" else "".join(data.split())[:64], validate=False)
    except (binascii.Error, ValueError):
        return None
    if mime == "image/png":
        if raw[:8] != b"\x89PNG\r\n\x1a\n" or raw[12:16] != b"IHDR":
            return None
        return struct.unpack(">II", raw[16:24])
    index = 2                                    # JPEG: the frame header (SOFn) gives height, then width
    while index + 9 < len(raw):
        if raw[index] != 0xFF:
            return None
        marker, length = raw[index + 1], struct.unpack(">H", raw[index + 2:index + 4])[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", raw[index + 5:index + 9])
            return width, height
        index += 2 + length
    return None


def bounded_image(mime, data):
    """The image's base64 data if it is base64 and declares a size a browser can open, else None."""
    if not (isinstance(data, str) and BASE64.fullmatch(data)):
        return None
    size = image_size(mime, data)
    return data if size is not None and size[0] * size[1] <= MAX_IMAGE_PIXELS else None


def allowed_attribute(tag, name, value):
    if name in ("class", "title"):
        return True
    if tag == "a" and name == "href":
        return SAFE_LINK.match(value) is not None
    return tag in ("td", "th") and name in ("colspan", "rowspan") and value.isdigit()


def clean_html(html):
    return bleach.clean("".join(html) if isinstance(html, list) else html, tags=TAGS,
                        attributes=allowed_attribute, protocols=PROTOCOLS, strip=True, strip_comments=True)


def as_text(source):
    """Markdown that shows `source` as it is: a fenced block no line of it can close."""
    longest = max((len(run) for run in re.findall(r"`+", source)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{source}\n{fence}"


def safe_output(output):
    output.pop("metadata", None)
    if output.get("output_type") in ("display_data", "execute_result"):
        output["metadata"] = {}
        data = output.get("data", {})
        kept = {}
        text = data.get("text/plain")
        if isinstance(text, list) and all(isinstance(line, str) for line in text):
            text = "".join(text)
        if isinstance(text, str):
            kept["text/plain"] = text
        for mime in IMAGES:
            if mime in data:
                image = bounded_image(mime, data[mime])
                if image is not None:
                    kept[mime] = image
                else:
                    kept["text/plain"] = (kept.get("text/plain", "") + f"\n[grader] an {mime} image was left out: "
                                          f"it is not base64 or declares more than {MAX_IMAGE_PIXELS:,} pixels").strip()
        if isinstance(data.get("text/html"), (str, list)):
            kept["text/html"] = clean_html(data["text/html"])
        output["data"] = kept
    return output


def make_safe(nb, course_sources):
    """The notebook, safe to render (see the module's docstring). `course_sources`: the sources of the
    course's own markdown and raw cells, which render as the course wrote them."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type in ("markdown", "raw") and cell.source not in course_sources:
            cell = nb.cells[index] = new_markdown_cell(as_text(cell.source), id=cell.get("id") or f"cell-{index}")
        metadata = {"nbgrader": cell.metadata["nbgrader"]} if "nbgrader" in cell.metadata else {}
        tags = cell.metadata.get("tags")
        if isinstance(tags, list) and all(isinstance(t, str) and PLAIN_TAG.fullmatch(t) for t in tags):
            metadata["tags"] = tags
        cell.metadata = metadata
        if cell.cell_type == "code":
            cell.outputs = [safe_output(output) for output in cell.get("outputs", [])]
    nb.metadata = {key: nb.metadata[key] for key in NOTEBOOK_METADATA if key in nb.metadata}
    return nb


class CourseCells:
    """`source in cells`: whether a markdown or raw cell's source is one of the course's own, in the current
    source or in any recorded release (releases.py): a hand-in from an earlier release renders as it was."""

    def __init__(self, assignment_id):
        self.assignment_id = assignment_id
        self.current = frozenset(cell.source for cell in grading.source_notebook(assignment_id).cells
                                 if cell.cell_type in ("markdown", "raw"))

    def __contains__(self, source):
        return source in self.current or any(
            releases.is_course_cell(self.assignment_id, kind, source) for kind in ("markdown", "raw"))


@functools.cache
def course_cell_sources(assignment_id):
    """The course's own markdown and raw cells of an assignment, as `CourseCells`."""
    return CourseCells(assignment_id)


class SafeForViewers(NbGraderPreprocessor):
    """The last step of autograde: the notebook that formgrader and the feedback pages render holds
    nothing of the student's that a browser would run."""

    def preprocess(self, nb, resources):
        return make_safe(nb, course_cell_sources(resources["nbgrader"]["assignment"])), resources
