import pytest

from invledger import EXTERNAL, InsufficientStock, InventoryError, Ledger, Move, MoveKind


@pytest.fixture
def ledger():
    led = Ledger()
    led.receive("BOLT", "north", 100)
    led.receive("NUT", "north", 40)
    led.receive("BOLT", "south", 10)
    return led


def test_receive_and_on_hand(ledger):
    assert ledger.on_hand("BOLT", "north") == 100
    assert ledger.on_hand("BOLT") == 110
    assert ledger.on_hand("WASHER", "north") == 0


def test_ship_and_transfer(ledger):
    ledger.ship("BOLT", "north", 30)
    move = ledger.transfer("BOLT", "north", "south", 20, note="rebalance")
    assert (move.kind, move.src, move.dst, move.qty) == (MoveKind.TRANSFER, "north", "south", 20)
    assert ledger.on_hand("BOLT", "north") == 50
    assert ledger.on_hand("BOLT", "south") == 30
    assert ledger.on_hand("BOLT") == 80


def test_insufficient_stock_records_nothing(ledger):
    before = ledger.moves
    with pytest.raises(InsufficientStock, match="south holds 10 of BOLT, cannot move 11"):
        ledger.ship("BOLT", "south", 11)
    with pytest.raises(InsufficientStock):
        ledger.transfer("NUT", "south", "north", 1)
    assert ledger.moves == before
    assert ledger.on_hand("BOLT", "south") == 10


def test_positive_adjustment(ledger):
    move = ledger.adjust("NUT", "north", 5, note="found in aisle 3")
    assert (move.kind, move.src, move.dst, move.qty) == (
        MoveKind.ADJUSTMENT, EXTERNAL, "north", 5)
    assert ledger.on_hand("NUT", "north") == 45


def test_invalid_operations(ledger):
    with pytest.raises(InventoryError):
        ledger.adjust("NUT", "north", 0)
    with pytest.raises(InventoryError, match="positive integer"):
        ledger.receive("NUT", "north", -2)
    with pytest.raises(InventoryError, match="positive integer"):
        ledger.receive("NUT", "north", 1.5)
    with pytest.raises(InventoryError, match="to itself"):
        ledger.transfer("NUT", "north", "north", 1)
    with pytest.raises(InventoryError, match="receive"):
        ledger.transfer("NUT", EXTERNAL, "north", 1)


def test_moves_are_numbered_and_listed(ledger):
    assert [m.seq for m in ledger.moves] == [1, 2, 3]
    assert ledger.warehouses() == ["north", "south"]
    assert ledger.skus() == ["BOLT", "NUT"]


def test_move_effect():
    move = Move(1, MoveKind.TRANSFER, "X", 4, "a", "b")
    assert (move.effect("a"), move.effect("b"), move.effect("c")) == (-4, 4, 0)
