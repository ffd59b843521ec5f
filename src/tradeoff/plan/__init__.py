"""``tradeoff plan``: the levers searched jointly for a model, its traffic and an SLA."""
