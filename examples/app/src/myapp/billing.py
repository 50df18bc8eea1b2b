"""The app's own logic, plain functions the plays call inside steps."""

from __future__ import annotations

from typing import Any


def invoice_total_cents(lines: list[dict[str, Any]]) -> int:
    """Return the total of an order's lines (``{"sku", "quantity", "unit_cents"}``) in cents."""
    total = 0
    for line in lines:
        quantity, unit_cents = int(line["quantity"]), int(line["unit_cents"])
        if quantity <= 0 or unit_cents < 0:
            raise ValueError(f"line {line.get('sku')!r}: quantity and price must be positive")
        total += quantity * unit_cents
    return total


def refund_cents(order: dict[str, Any], reason: str) -> int:
    """Return how much of an order to refund: all of it, or half when the goods were used."""
    total = int(order["total_cents"])
    return total // 2 if reason == "used" else total
