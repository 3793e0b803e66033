"""Sphinx configuration: Markdown pages (MyST) and an API reference generated from the docstrings."""

project = "trainer-plugins"
author = "trainer-plugins developers"
extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_inherit_docstrings = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
nitpicky = False
suppress_warnings = ["myst.header"]
html_theme = "alabaster"
