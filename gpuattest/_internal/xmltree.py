"""Small lxml helpers shared by the RIM parser and the XML-DSig profile check."""

from __future__ import annotations

from lxml import etree

__all__ = ["DSIG_NS", "XML_NS", "element_children", "local_name", "one_line", "qname"]

DSIG_NS = "http://www.w3.org/2000/09/xmldsig#"
XML_NS = "http://www.w3.org/XML/1998/namespace"


def qname(ns: str, local: str) -> str:
    """Clark notation, ``{ns}local``, as lxml spells qualified names."""
    return f"{{{ns}}}{local}"


def element_children(el: etree._Element) -> list[etree._Element]:
    """Element children only (comments and processing instructions left out)."""
    return list(el.iterchildren("*"))


def local_name(el: etree._Element) -> str:
    """The element's name without its namespace."""
    return etree.QName(el).localname


def one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line, whitespace collapsed, cut to ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
