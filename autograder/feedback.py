"""The exporter of nbgrader's feedback pages: nbconvert's HTMLExporter without its BeautifulSoup pass.

After rendering, HTMLExporter parses the whole page with BeautifulSoup to give every image without
alternative text a placeholder one and JupyterLab's cells a tabindex, then writes the page out again.
nbgrader's feedback template is the classic one, which has no JupyterLab cells, so only the images
are concerned; the pass took 1.2 of the 2 s of 09's feedback page (716 kB), on every notebook a class
grades. Here the same placeholder goes into every `<img>` tag without an `alt` by one regular expression.
`nbgrader_config()` makes this nbgrader's exporter for feedback (`GenerateFeedback.exporter_class`).
"""
import re

from nbconvert.exporters import HTMLExporter, TemplateExporter
from nbconvert.filters.highlight import Highlight2HTML
from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

NO_ALT_TEXT = "No description has been provided for this image"   # HTMLExporter's own words
IMG_WITHOUT_ALT = re.compile(r"<img\b(?![^>]*\salt\s*=)", re.IGNORECASE)


class FeedbackHTMLExporter(HTMLExporter):
    def from_notebook_node(self, nb, resources=None, **kw):
        # HTMLExporter.from_notebook_node (nbconvert 7.17) up to its BeautifulSoup pass
        language = nb.metadata.get("language_info", {})
        lexer = language.get("pygments_lexer", language.get("name", None))
        self.register_filter("highlight_code",
                             self.filters.get("highlight_code", Highlight2HTML(pygments_lexer=lexer, parent=self)))
        resources = self._init_resources(resources)
        self.register_filter("filter_data_type",
                             WidgetsDataTypeFilter(notebook_metadata=self._nb_metadata, parent=self,
                                                   resources=resources))
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        return IMG_WITHOUT_ALT.sub(f'<img alt="{NO_ALT_TEXT}"', html), resources
