from invledger import Ledger, Summary, low_stock, movement_summary, stock_report


def make_ledger():
    led = Ledger()
    led.receive("BOLT", "north", 100)
    led.receive("NUT", "north", 40)
    led.transfer("BOLT", "north", "south", 30)
    led.ship("BOLT", "south", 12)
    led.ship("NUT", "north", 40)
    led.adjust("BOLT", "north", 2)
    return led


def test_stock_report_skips_empty_stock():
    assert stock_report(make_ledger()) == [("north", "BOLT", 72), ("south", "BOLT", 18)]


def test_movement_summary():
    summary = movement_summary(make_ledger())
    assert summary["north"] == Summary(received=140, shipped=40, transferred_out=30,
                                       adjusted=2)
    assert summary["south"] == Summary(transferred_in=30, shipped=12)


def test_movement_summary_for_one_sku():
    summary = movement_summary(make_ledger(), sku="NUT")
    assert summary["north"] == Summary(received=40, shipped=40)
    assert summary["south"] == Summary()


def test_summary_net_matches_stock():
    led = make_ledger()
    for warehouse, row in movement_summary(led, sku="BOLT").items():
        assert row.net == led.on_hand("BOLT", warehouse)


def test_low_stock():
    led = make_ledger()
    minimums = {"BOLT": 20, "NUT": 5, "WASHER": 1}
    assert low_stock(led, minimums) == [("NUT", 0, 5), ("WASHER", 0, 1)]
    assert low_stock(led, minimums, warehouse="south") == [
        ("BOLT", 18, 20), ("NUT", 0, 5), ("WASHER", 0, 1)]
