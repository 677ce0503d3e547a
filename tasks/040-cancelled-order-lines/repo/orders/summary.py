from .models import Order


def summarize(order: Order) -> dict:
    return {
        "ref": order.ref,
        "lines": len(order.lines),
        "items": sum(l.qty for l in order.lines),
        "cancelled": sum(1 for l in order.lines if l.cancelled),
        "total": order.total(),
    }
