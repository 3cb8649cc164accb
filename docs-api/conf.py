# Sphinx + Breathe: renders Doxygen's XML of include/stepwise/ as the site's C++ API
# reference (whose page bodies snippets/api_pages.py makes pages of the MkDocs site).
# Run: STEPWISE_DOXYGEN_XML=build/docs/doxygen/xml /usr/bin/python3 -m sphinx -W -b html docs-api build/docs/api
import os

project = "stepwise"
copyright = "stepwise authors"
extensions = ["breathe"]
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
breathe_projects = {"stepwise": os.path.join(_root, os.environ.get("STEPWISE_DOXYGEN_XML", "build/docs/doxygen/xml"))}
breathe_default_project = "stepwise"
breathe_default_members = ("members",)
primary_domain = "cpp"
highlight_language = "cpp"
html_theme = "alabaster"
html_title = "stepwise C++ API reference"
html_static_path = []
exclude_patterns = ["Doxyfile"]


# `.. stepwise-header:: engine.h` expands to one Breathe directive per class, function,
# enum, variable and macro that Doxygen found in include/stepwise/engine.h, so a new
# symbol appears without editing these pages (`doxygenfile` would re-declare the namespace
# on every page: duplicate declarations).
import re
import xml.etree.ElementTree as ET

from docutils.parsers.rst import Directive


def _type_text(elem):
    return re.sub(r"\s+", " ", "".join(elem.itertext())).strip() if elem is not None else ""


def header_directives(xml_dir, header):
    index = ET.parse(os.path.join(xml_dir, "index.xml")).getroot()
    file_id = next(c.get("refid") for c in index.iter("compound")
                   if c.get("kind") == "file" and c.findtext("name") == os.path.basename(header))
    file_xml = ET.parse(os.path.join(xml_dir, file_id + ".xml")).getroot()
    out = []
    classes = {c.findtext("name") for c in index.iter("compound") if c.get("kind") in ("class", "struct")}
    for inner in file_xml.iter("innerclass"):
        if inner.text.rsplit("::", 1)[0] in classes:
            continue  # a nested class (Context::Pending): its outer class's :members: shows it
        kind = "doxygenstruct" if inner.get("refid").startswith("struct") else "doxygenclass"
        out += [f".. {kind}:: {inner.text}", "   :members:", ""]
    for m in file_xml.iter("memberdef"):
        if m.get("kind") == "define":
            out += [f".. doxygendefine:: {m.findtext('name')}", ""]
    # Free functions, enums, variables of stepwise and its nested namespaces (fused, cuda).
    namespaces = [(c.findtext("name"), c.get("refid")) for c in index.iter("compound")
                  if c.get("kind") == "namespace" and c.findtext("name").startswith("stepwise")]
    for ns_name, ns_id in namespaces:
        ns = ET.parse(os.path.join(xml_dir, ns_id + ".xml")).getroot()
        for m in ns.iter("memberdef"):
            if m.find("location").get("file") != "stepwise/" + header:
                continue
            name = ns_name + "::" + m.findtext("name")
            if m.get("kind") == "function":
                params = ", ".join(_type_text(p.find("type")) for p in m.findall("param"))
                out += [f".. doxygenfunction:: {name}({params})", ""]
            elif m.get("kind") in ("enum", "variable", "typedef"):
                out += [f".. doxygen{m.get('kind')}:: {name}", ""]
    return out


def usage_lines(header):
    """The header's usage example, as the tests compile it (snippets/blocks.py: one parser)."""
    import sys
    sys.path.insert(0, os.path.join(_root, "snippets"))
    import blocks
    path = os.path.join(_root, "include", "stepwise", header)
    out = []
    for b in blocks.header_blocks(path, blocks.ROOT):
        test = f"docs:{blocks.HEADERS_PAGE}:{b.id}"
        how = (f"compiled and run by the test ``{test}``" if b.kind == "fragment"
               else f"not compiled: {b.attrs.get('reason', '')}")
        # The anchor of the API pages' "Used in" links to this block (snippets/api_pages.py).
        out += [f".. _snippet-{b.id}:", "", f"Usage ({how}):", "", ".. code-block:: cpp", ""]
        out += ["   " + l if l else "" for l in b.shown_lines()] + [""]
    return out


class StepwiseHeader(Directive):
    required_arguments = 1

    def run(self):
        lines = usage_lines(self.arguments[0]) + header_directives(breathe_projects["stepwise"], self.arguments[0])
        self.state_machine.insert_input(lines, self.state_machine.input_lines.source(0))
        return []


def setup(app):
    app.add_directive("stepwise-header", StepwiseHeader)

# The same favicon as the MkDocs pages (Material's), so browsers don't request a missing one.
_favicon = "/usr/share/mkdocs/themes/material/assets/images/favicon.png"
html_favicon = _favicon if os.path.exists(_favicon) else None
