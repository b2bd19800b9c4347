"""Where the hook speaks MetaSchedule: records replayed as traces and checked against bounds (``msdb``, ``guard``), the
CPU rules' schedules (``rules``), transfers re-tiled, padded or relocated (``padding``, ``recompute``, ``ranking``),
and schedules synthesized and ranked by a cost model (``synthesis``, ``costmodel``). Imports only the layers below."""
