"""``POST /v1/privacy/plan``: propose ε, the window, the sketch and the per-table budget split
for a stream from its expected size and a target loss (``service.core.dp.plan``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api.deps import AnyKey, JsonRoute
from service.core.dp.plan import PlanRequest, make_plan
from service.errors import ValidationError, error_responses

router = APIRouter(prefix="/v1/privacy", tags=["privacy"], route_class=JsonRoute)


@router.post(
    "/plan",
    responses={
        200: {
            "description": "the proposal: epsilon, window_seconds, hot_windows (chosen from "
            "the rate unless given: enough hot rows for the model, up to 3 windows, within "
            "max_hot_seconds), retention_windows, the exposure cost (raw_rows_held, "
            "raw_hours_held, exposure), width, depth, the per-table split (tables), the slots "
            "for selected groups (selection_slots: 0 unless epsilon_selection > 0; "
            "slot_share, slot_noise_factor, epsilon_without_slots), the predicted DP cost and "
            "loss, why (one line each), and stream (a POST /v1/streams body with it); "
            "feasible false when no window up to max_hot_seconds (a year with hot_windows "
            "given) meets the target at max_epsilon (the rest is then the closest it gets)"
        },
        **error_responses(ValidationError),
    },
)
async def plan(body: PlanRequest, _: AnyKey) -> dict[str, Any]:
    """The planning rule of docs/ARCHITECTURE.md "Planning a stream's budget": a
    signal-to-noise criterion per table, calibrated on the stream simulator; the hot period
    chosen from the rate against the raw data it holds, and no table slot for selected groups
    unless selection is asked for."""
    p = make_plan(body)
    return p.as_dict() | {"stream": p.stream_body("planned")}
