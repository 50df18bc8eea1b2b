"""The app's plays; the image runs them with ``lane-worker run --app myapp.plays:app``."""

from __future__ import annotations

from typing import Any

from myapp.billing import invoice_total_cents, refund_cents
from worker import App, TaskContext

app = App()


@app.play("send-invoice")
async def send_invoice(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Price an order, leave a grace period for changes, then send its invoice once."""
    total = await ctx.step("price", lambda: invoice_total_cents(params["lines"]))
    # A durable sleep: the run parks in Postgres and any worker of its release resumes it,
    # or of the next release if this one was retired meanwhile.
    await ctx.sleep("grace-period", float(params.get("grace_s", 600)))
    # A step's result is committed: a resumed or retried run does not send it again.
    sent = await ctx.step("send", lambda: {"to": params["email"], "total_cents": total})
    return {"invoice": sent, "release": ctx.release_id}


@app.play("refund")
async def refund(ctx: TaskContext, params: dict[str, Any]) -> dict[str, Any]:
    """Hold a refund until someone approves it (the event `approved`), for a day at most."""
    order = await ctx.step(
        "load-order", lambda: {"id": params["order"], "total_cents": params["total_cents"]}
    )
    # `lane-worker signal RUN_ID approved --data '{"by": "ada"}'` (or the app) sends it.
    reply = await ctx.wait_for_event("approval", "approved", timeout=24 * 3600)
    if reply["timed_out"]:
        return {"order": order["id"], "refunded_cents": 0, "why": "not approved within a day"}
    amount = await ctx.step(
        "refund", lambda: refund_cents(order, str(params.get("reason", "unwanted")))
    )
    return {"order": order["id"], "refunded_cents": amount, "approved_by": reply.get("by")}
