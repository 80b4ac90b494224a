"""Validate CSV rows against a typed column schema."""

from csvschema.converters import CONVERTERS, get_converter
from csvschema.schema import Column, FieldError, Report, RowError, Schema

__all__ = ["CONVERTERS", "Column", "FieldError", "Report", "RowError", "Schema", "get_converter"]
__version__ = "0.3.1"
