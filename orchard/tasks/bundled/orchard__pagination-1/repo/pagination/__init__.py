"""Paginate sequences and compute page windows for a UI."""

from pagination.paginator import EmptyPage, InvalidPage, Page, PageNotAnInteger, Paginator
from pagination.window import page_links, page_window, render_links

__all__ = ["EmptyPage", "InvalidPage", "Page", "PageNotAnInteger", "Paginator", "page_links",
           "page_window", "render_links"]
__version__ = "2.1.0"
