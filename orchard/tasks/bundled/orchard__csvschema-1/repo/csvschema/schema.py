"""Schemas: a list of columns, and the validation of rows and whole files against them."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from csvschema.converters import Converter, get_converter


@dataclass(frozen=True)
class Column:
    """One expected column.

    ``type`` is a name from :data:`csvschema.CONVERTERS` or a callable converter. An empty
    cell in a ``required`` column is an error; in an optional one it becomes ``default``.
    ``choices``, when given, restricts the converted value.
    """

    name: str
    type: Union[str, Converter] = "str"
    required: bool = True
    default: Any = None
    choices: Optional[Sequence[Any]] = None

    def convert(self, text: str) -> Any:
        """Convert a non-empty, stripped cell; raises ``ValueError`` when it is invalid."""
        value = get_converter(self.type)(text)
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(repr(c) for c in self.choices)
            raise ValueError(f"{value!r} is not one of {allowed}")
        return value


@dataclass(frozen=True)
class FieldError:
    """A problem with one cell (or, with ``column=None``, with a whole row or the header)."""

    line: Optional[int]
    column: Optional[str]
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}" if self.line is not None else "header"
        if self.column is not None:
            where += f", column {self.column!r}"
        return f"{where}: {self.message}"


class RowError(ValueError):
    """A row failed validation; ``errors`` lists every problem found in it."""

    def __init__(self, errors: list[FieldError]):
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


@dataclass
class Report:
    """The outcome of validating a file: the converted valid rows and all errors."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors


class Schema:
    """An ordered collection of :class:`Column` definitions.

    With ``strict=True`` columns not in the schema, and cells beyond the header, are errors;
    otherwise they are ignored.
    """

    def __init__(self, columns: Iterable[Column], *, strict: bool = False):
        self.columns = list(columns)
        self.strict = strict
        seen: set[str] = set()
        for col in self.columns:
            if col.name in seen:
                raise ValueError(f"duplicate column {col.name!r} in schema")
            seen.add(col.name)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def check_header(self, header: Sequence[str]) -> list[FieldError]:
        """Errors for required columns missing from ``header`` (and, if strict, unknown ones)."""
        present = set(header)
        errors = [FieldError(None, c.name, "required column is missing")
                  for c in self.columns if c.required and c.name not in present]
        if self.strict:
            known = set(self.names)
            errors += [FieldError(None, name, "unknown column")
                       for name in header if name not in known]
        return errors

    def validate_row(self, row: Mapping[Optional[str], Any], line: Optional[int] = None
                     ) -> dict[str, Any]:
        """Convert one row (a mapping as produced by :class:`csv.DictReader`).

        Returns the converted row, keyed by column name, or raises :class:`RowError` listing
        every invalid cell.
        """
        errors: list[FieldError] = []
        cleaned: dict[str, Any] = {}
        for col in self.columns:
            raw = row.get(col.name, "")
            text = raw.strip()
            if not text:
                if col.required:
                    errors.append(FieldError(line, col.name, "missing value"))
                else:
                    cleaned[col.name] = col.default
                continue
            try:
                cleaned[col.name] = col.convert(text)
            except ValueError as e:
                errors.append(FieldError(line, col.name, str(e)))
        extra = row.get(None)
        if self.strict and extra and any(str(cell).strip() for cell in extra):
            errors.append(FieldError(line, None, f"{len(extra)} unexpected extra field(s)"))
        if errors:
            raise RowError(errors)
        return cleaned

    def validate(self, source: Union[str, Iterable[str]], *, delimiter: str = ","
                 ) -> Report:
        """Validate CSV text (a string or an iterable of lines, e.g. an open file).

        The first line is the header. Every data row is validated; the report holds the
        converted valid rows and the errors of the invalid ones, with their line numbers.
        """
        if isinstance(source, str):
            source = io.StringIO(source)
        reader = csv.DictReader(source, delimiter=delimiter)
        header = reader.fieldnames or []
        report = Report(errors=self.check_header(header))
        if report.errors:
            return report
        for row in reader:
            try:
                report.rows.append(self.validate_row(row, line=reader.line_num))
            except RowError as e:
                report.errors.extend(e.errors)
        return report
