"""A shop: search, categories, product pages, a cart and a checkout that places orders."""

from __future__ import annotations

import sys

from sitekit import NotFound, Redirect, Site, esc, main, page  # beside it: run as a script

PRODUCTS = [
    ("kb-101", "Mechanical Keyboard", "computers", 89.0, "Tactile switches, full size."),
    ("ms-202", "Wireless Mouse", "computers", 25.5, "Two buttons and a wheel."),
    ("mn-303", "27 inch Monitor", "computers", 219.0, "QHD, matte screen."),
    ("hd-404", "Noise Cancelling Headphones", "audio", 149.0, "Over-ear, 30 h battery."),
    ("sp-505", "Bluetooth Speaker", "audio", 45.0, "Waterproof, fits a bag."),
    ("eb-606", "Wired Earbuds", "audio", 12.0, "With a microphone."),
    ("kt-707", "Electric Kettle", "kitchen", 34.0, "1.7 litres, stainless steel."),
    ("tb-808", "Bamboo Cutting Board", "kitchen", 18.5, "Large, with a groove."),
    ("cm-909", "Coffee Grinder", "kitchen", 59.0, "Burr grinder, 15 settings."),
    ("bk-111", "Hiking Backpack", "outdoor", 79.0, "40 litres, rain cover."),
    ("tn-222", "Two Person Tent", "outdoor", 129.0, "Sets up in five minutes."),
    ("fl-333", "Steel Water Flask", "outdoor", 21.0, "Keeps drinks cold for 24 h."),
]
SEED = {"products": [{"sku": s, "name": n, "category": c, "price": p, "description": d}
                     for s, n, c, p, d in PRODUCTS], "cart": {}, "orders": []}
NAV = ('<a href="/">Home</a><a href="/cart">Cart</a><a href="/orders">Orders</a>'
       '<form action="/search" style="display:inline"><input name="q" aria-label="Search '
       'products"><button>Search</button></form>')


def build(state_path: str) -> Site:
    site = Site(state_path, SEED)
    products = {p["sku"]: p for p in site.state["products"]}

    def listing(items: list) -> str:
        rows = "".join(f'<li><a href="/product?sku={esc(p["sku"])}">{esc(p["name"])}</a> '
                       f'${p["price"]:.2f}</li>' for p in items)
        return f"<ul>{rows}</ul>" if items else "<p>No products found.</p>"

    @site.route("GET", "/")
    def home(s: Site, q: dict) -> str:
        cats = sorted({p["category"] for p in products.values()})
        links = "".join(f'<li><a href="/category?name={c}">{c.title()}</a></li>' for c in cats)
        return page("Shop", f"<h2>Categories</h2><ul>{links}</ul><h2>All products</h2>"
                    + listing(list(products.values())), NAV)

    @site.route("GET", "/search")
    def search(s: Site, q: dict) -> str:
        term = q.get("q", "").strip().lower()
        found = [p for p in products.values() if term and (term in p["name"].lower()
                                                           or term in p["description"].lower())]
        return page(f"Results for {term}", listing(found), NAV)

    @site.route("GET", "/category")
    def category(s: Site, q: dict) -> str:
        name = q.get("name", "")
        found = sorted((p for p in products.values() if p["category"] == name),
                       key=lambda p: p["price"])
        return page(name.title() or "Category", listing(found), NAV)

    @site.route("GET", "/product")
    def product(s: Site, q: dict) -> str:
        p = products.get(q.get("sku", ""))
        if p is None:
            raise NotFound(f"no product {q.get('sku')}")
        form = (f'<form method="post" action="/cart/add"><input type="hidden" name="sku" '
                f'value="{esc(p["sku"])}"><label>Quantity <input name="qty" value="1" '
                'type="number" min="1"></label><button>Add to cart</button></form>')
        return page(p["name"], f'<p>{esc(p["description"])}</p><p>Price: '
                    f'${p["price"]:.2f}</p><p>SKU: {esc(p["sku"])}</p>{form}', NAV)

    @site.route("POST", "/cart/add")
    def add(s: Site, f: dict) -> str:
        sku = f.get("sku", "")
        if sku not in products:
            raise NotFound(f"no product {sku}")
        qty = max(1, int(f.get("qty") or 1)) if str(f.get("qty") or "1").isdigit() else 1
        s.state["cart"][sku] = s.state["cart"].get(sku, 0) + qty
        raise Redirect("/cart")

    @site.route("POST", "/cart/remove")
    def remove(s: Site, f: dict) -> str:
        s.state["cart"].pop(f.get("sku", ""), None)
        raise Redirect("/cart")

    @site.route("GET", "/cart")
    def cart(s: Site, q: dict) -> str:
        items = s.state["cart"]
        if not items:
            return page("Cart", "<p>Your cart is empty.</p>", NAV)
        rows = "".join(
            f'<tr><td>{esc(products[k]["name"])}</td><td>{n}</td>'
            f'<td>${products[k]["price"] * n:.2f}</td><td><form method="post" '
            f'action="/cart/remove"><input type="hidden" name="sku" value="{esc(k)}">'
            f'<button>Remove {esc(products[k]["name"])}</button></form></td></tr>'
            for k, n in items.items())
        total = sum(products[k]["price"] * n for k, n in items.items())
        return page("Cart", f"<table><tr><th>Item</th><th>Quantity</th><th>Price</th><th></th>"
                    f"</tr>{rows}</table><p>Total: ${total:.2f}</p>"
                    '<p><a href="/checkout">Proceed to checkout</a></p>', NAV)

    @site.route("GET", "/checkout")
    def checkout(s: Site, q: dict) -> str:
        form = ('<form method="post" action="/checkout"><p><label>Full name <input '
                'name="name"></label></p><p><label>Address <input name="address"></label></p>'
                '<p><label>Shipping <select name="shipping"><option value="standard">Standard'
                '</option><option value="express">Express</option></select></label></p>'
                "<button>Place order</button></form>")
        return page("Checkout", form, NAV)

    @site.route("POST", "/checkout")
    def place(s: Site, f: dict) -> str:
        if not s.state["cart"]:
            return page("Checkout", "<p>Your cart is empty.</p>", NAV)
        if not f.get("name", "").strip() or not f.get("address", "").strip():
            return page("Checkout", "<p>Please fill in your name and address.</p>", NAV)
        order = {"id": len(s.state["orders"]) + 1, "items": dict(s.state["cart"]),
                 "name": f["name"].strip(), "address": f["address"].strip(),
                 "shipping": f.get("shipping", "standard"),
                 "total": round(sum(products[k]["price"] * n
                                    for k, n in s.state["cart"].items()), 2)}
        s.state["orders"].append(order)
        s.state["cart"] = {}
        raise Redirect(f"/order?id={order['id']}")

    @site.route("GET", "/order")
    def order(s: Site, q: dict) -> str:
        found = [o for o in s.state["orders"] if str(o["id"]) == q.get("id")]
        if not found:
            raise NotFound(f"no order {q.get('id')}")
        o = found[0]
        return page(f"Order {o['id']} placed", f'<p class="msg">Thank you, {esc(o["name"])}. '
                    f'Total ${o["total"]:.2f}, {esc(o["shipping"])} shipping.</p>', NAV)

    @site.route("GET", "/orders")
    def orders(s: Site, q: dict) -> str:
        rows = "".join(f"<li>Order {o['id']}: ${o['total']:.2f}</li>" for o in s.state["orders"])
        return page("Orders", f"<ul>{rows}</ul>" if rows else "<p>No orders yet.</p>", NAV)

    return site


if __name__ == "__main__":
    sys.exit(main(build))
