"""Feedback pages come from autograder.feedback's exporter: nbconvert's page, without its BeautifulSoup pass."""
import base64
import os
import re

import nbformat
import nbgrader
from bs4 import BeautifulSoup
from nbconvert.exporters import HTMLExporter
from nbgrader.converters import GenerateFeedback
from nbgrader.coursedir import CourseDirectory
from traitlets.config import Config

from autograder.config import nbgrader_config
from autograder.feedback import NO_ALT_TEXT, FeedbackHTMLExporter

FORMGRADER = os.path.join(os.path.dirname(nbgrader.__file__), "server_extensions", "formgrader")
ONE_PIXEL_PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c4890000000d4944415478da63f8cfc0f01f"
    "0005000201a5b1e5e30000000049454e44ae426082")).decode()


def graded_notebook():
    """A notebook as autograde leaves it: markdown with an image, a graded cell whose outputs hold a plot,
    HTML with images with and without alternative text, printed markup, and an error."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["language_info"] = {"name": "python", "pygments_lexer": "ipython3"}
    html = ('<p>raw <img src="a.png"> and <IMG SRC="b.png" ALT="given"> and <img\nsrc="c.png"/> and '
            '<IMG SRC="d.png" data-alt="not alt text"> and <img src="e.png" ALT="given too"></p>')
    outputs = [nbformat.v4.new_output("stream", name="stdout", text="printed <img src=x> & <b>\n"),
               nbformat.v4.new_output("display_data", data={"image/png": ONE_PIXEL_PNG, "text/plain": "<Figure>"}),
               nbformat.v4.new_output("display_data", data={"text/html": html}),
               nbformat.v4.new_output("error", ename="AssertionError", evalue="a < b",
                                      traceback=["\x1b[31mAssertionError\x1b[0m: a < b"])]
    test = nbformat.v4.new_code_cell("assert attention(q, k, v).shape == (2, 3)", outputs=outputs)
    test.metadata["nbgrader"] = {"grade": True, "grade_id": "test_shape", "points": 2, "solution": False,
                                 "locked": True, "score": 1}
    nb.cells = [nbformat.v4.new_markdown_cell(f"# Attention\nSome *text* and ![](data:image/png;base64,{ONE_PIXEL_PNG})"),
                test]
    return nb


def feedback_page(exporter_class, nb):
    config = Config()   # what GenerateFeedback sets up for its exporter
    config.HTMLExporter.template_name = "feedback"
    config.HTMLExporter.extra_template_basedirs = [os.path.join(FORMGRADER, "templates")]
    config.HTMLExporter.extra_template_paths = [os.path.join(FORMGRADER, "static", "node_modules", "bootstrap",
                                                             "dist", "css")]
    resources = {"nbgrader": {"notebook": "attention", "score": 1, "max_score": 2, "late_penalty": 0}}
    return exporter_class(config=config).from_notebook_node(nb, resources=resources)[0]


def test_the_feedback_page_is_nbconverts_page():
    """The same document as nbconvert's HTMLExporter writes (both read back by the same parser), each image
    without alternative text given nbconvert's placeholder."""
    nb = graded_notebook()
    theirs, ours = feedback_page(HTMLExporter, nb), feedback_page(FeedbackHTMLExporter, nb)
    assert str(BeautifulSoup(ours, "html.parser")) == str(BeautifulSoup(theirs, "html.parser")), (
        "the feedback page differs from nbconvert's")
    images = BeautifulSoup(ours, "html.parser").find_all("img")
    assert len(images) == 7 and all(image.get("alt") for image in images[1:]), images
    assert [image["alt"] for image in images].count(NO_ALT_TEXT) == 4, [image.get("alt") for image in images]
    # a parser keeps one of two alt attributes, a browser the first: the author's text must be the only one
    tags = re.findall(r"<img\b[^>]*>", ours, re.IGNORECASE)
    assert all(len(re.findall(r"\salt\s*=", tag, re.IGNORECASE)) <= 1 for tag in tags), [t[:80] for t in tags]


def test_nbgrader_writes_feedback_with_it(tmp_path):
    config = nbgrader_config(root=tmp_path, work=tmp_path)
    converter = GenerateFeedback(coursedir=CourseDirectory(config=config), config=config)
    assert converter.exporter_class is FeedbackHTMLExporter
