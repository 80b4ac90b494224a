from datetime import date

import pytest

from csvschema import Column, FieldError, RowError, Schema

PRODUCTS = Schema([
    Column("id", "int"),
    Column("name"),
    Column("price", "float", required=False, default=0.0),
    Column("active", "bool", required=False, default=True),
])


def test_converts_typed_columns():
    report = PRODUCTS.validate("id,name,price,active\n1,widget,2.50,no\n2,gadget,10,yes\n")
    assert report.ok
    assert report.rows == [
        {"id": 1, "name": "widget", "price": 2.5, "active": False},
        {"id": 2, "name": "gadget", "price": 10.0, "active": True},
    ]


def test_empty_optional_cell_uses_default():
    report = PRODUCTS.validate("id,name,price,active\n7,bolt,,\n")
    assert report.ok
    assert report.rows == [{"id": 7, "name": "bolt", "price": 0.0, "active": True}]


def test_whitespace_only_cell_counts_as_empty():
    report = PRODUCTS.validate("id,name,price,active\n7,  ,  , \n")
    assert report.rows == []
    assert report.errors == [FieldError(2, "name", "missing value")]


def test_optional_column_absent_from_header():
    report = PRODUCTS.validate("id,name\n3,nut\n")
    assert report.ok
    assert report.rows == [{"id": 3, "name": "nut", "price": 0.0, "active": True}]


def test_invalid_cells_are_reported_with_line_numbers():
    text = "id,name,price,active\n1,ok,1.0,yes\nx,bad,abc,maybe\n3,fine,2,no\n"
    report = PRODUCTS.validate(text)
    assert [r["id"] for r in report.rows] == [1, 3]
    assert [(e.line, e.column) for e in report.errors] == [
        (3, "id"), (3, "price"), (3, "active")]
    assert str(report.errors[0]) == "line 3, column 'id': not an integer: 'x'"


def test_missing_required_header_column():
    report = PRODUCTS.validate("name,price\nwidget,1\n")
    assert report.rows == []
    assert [str(e) for e in report.errors] == ["header, column 'id': required column is missing"]


def test_choices_and_dates():
    schema = Schema([Column("size", choices=("S", "M", "L")), Column("since", "date")])
    assert schema.validate_row({"size": "M", "since": "2021-03-04"}) == {
        "size": "M", "since": date(2021, 3, 4)}
    with pytest.raises(RowError) as info:
        schema.validate_row({"size": "XL", "since": "04/03/2021"}, line=9)
    messages = [e.message for e in info.value.errors]
    assert messages[0] == "'XL' is not one of 'S', 'M', 'L'"
    assert messages[1].startswith("not a date")


def test_strict_schema_rejects_unknown_columns_and_extra_cells():
    schema = Schema([Column("a", "int")], strict=True)
    assert [e.message for e in schema.check_header(["a", "b"])] == ["unknown column"]
    report = schema.validate("a\n1\n2,3\n")
    assert report.rows == [{"a": 1}]
    assert str(report.errors[0]) == "line 3: 1 unexpected extra field(s)"


def test_lenient_schema_ignores_extra_cells():
    report = Schema([Column("a", "int")]).validate("a\n1,2,3\n")
    assert report.ok and report.rows == [{"a": 1}]


def test_duplicate_column_names_rejected():
    with pytest.raises(ValueError, match="duplicate column 'a'"):
        Schema([Column("a"), Column("a", "int")])


def test_unknown_type_name():
    with pytest.raises(ValueError, match="unknown column type 'decimal'"):
        Column("x", "decimal").convert("1.0")
